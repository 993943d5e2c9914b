"""Facts about the machine a run measured: CPU, cores, OS, Python, and the version of every system."""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import platform
import shutil
import subprocess
import time

# the versions the report's header lists, in order (keys of machine_info())
VERSIONED = ("shmq", "faster-fifo", "pyzmq", "posix_ipc", "iceoryx2", "redis-py", "redis-server", "pika",
             "rabbitmq-server", "nats-py", "nats-server")
# the versions that belong to each system (its client package, its server), for a table of some of them
SYSTEM_VERSIONS = {
    "faster-fifo": ("faster-fifo",), "zmq": ("pyzmq",), "posix-mq": ("posix_ipc",), "iceoryx2": ("iceoryx2",),
    "iceoryx2-poll": ("iceoryx2",), "redis": ("redis-py", "redis-server"), "redis-streams": ("redis-py", "redis-server"),
    "rabbitmq": ("pika", "rabbitmq-server"), "nats-core": ("nats-py", "nats-server"),
    "nats-js": ("nats-py", "nats-server"),
}
# the same for the stream benchmark (python -m bench.streams)
STREAM_VERSIONED = ("shmq", "redis-py", "redis-server", "nats-py", "nats-server")
# where shmq says whether its C hot paths are built: the one shmq internal the report reads
SHMQ_FAST_FLAG = ("shmq.engine.shm.cpaths", "FAST")


def _dist_version(name):
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _shmq_version():
    """'0.1.0 (C hot paths)' / '0.1.0 (pure Python)'; without the suffix if shmq does not say."""
    try:
        import shmq
    except ImportError:
        return None
    version = getattr(shmq, "__version__", None) or _dist_version("shmq") or "source tree"
    module, attr = SHMQ_FAST_FLAG
    try:
        fast = getattr(importlib.import_module(module), attr, None)
    except ImportError:
        fast = None
    return version if fast is None else f"{version} ({'C hot paths' if fast else 'pure Python'})"


def _zmq_version():
    try:
        import zmq
    except ImportError:
        return None
    return f"{zmq.__version__} (libzmq {zmq.zmq_version()})"


def _physical_cores():
    try:
        import psutil
    except ImportError:
        return None
    return psutil.cpu_count(logical=False)


def _cpu_model():
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _version_output(program):
    """What ``program --version`` prints, or None if it is not on the PATH or fails."""
    exe = shutil.which(program)
    if exe is None:
        return None
    try:
        return subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None


def _redis_server_version():
    out = _version_output("redis-server")
    if out is None:
        return None
    return next((w[2:] for w in out.split() if w.startswith("v=")), out.strip() or None)


def _nats_server_version():
    """'2.9.10' from 'nats-server: v2.9.10'."""
    out = _version_output("nats-server")
    if out is None:
        return None
    return out.strip().rsplit(" ", 1)[-1].removeprefix("v") or None


def _rabbitmq_version():
    """'3.10.8' from the Debian package's rabbitmq_server-3.10.8 directory (asking the node needs it running)."""
    import glob

    from bench.servers import RABBITMQ_BIN
    found = sorted(glob.glob(os.path.join(os.path.dirname(RABBITMQ_BIN), "lib", "rabbitmq_server-*")))
    return os.path.basename(found[-1]).removeprefix("rabbitmq_server-") if found else None


def dist_versions(*names):
    """{name: the installed distribution's version, or None}: the packages a bench adds to its machine's facts."""
    return {name: _dist_version(name) for name in names}


def python_speed(tries=1000, additions=2000):
    """How fast this machine runs Python now: a fixed loop of ``additions`` additions, timed
    ``tries`` times; ``[best, median]`` in µs. On a quiet host the two agree; a shared or
    throttled VM shows a slow best, or a median far above it: what a run's figures were
    made on, for comparing runs of different days."""
    times = []
    for _ in range(tries):
        t = time.perf_counter()
        s = 0
        for j in range(additions):
            s += j
        times.append(time.perf_counter() - t)
    times.sort()
    return [round(times[0] * 1e6, 1), round(times[len(times) // 2] * 1e6, 1)]


def speed_text(speed) -> str:
    """``python_speed``'s figures in words (one line of a report or a page's run line)."""
    return f"a Python loop of 2,000 additions {speed[0]:.0f} µs at best, {speed[1]:.0f} at the median"


def machine_info():
    """CPU, cores, OS, Python, how fast it runs Python (``python_speed``) and package
    versions (the JSON's "machine")."""
    return {
        "python_speed_us": python_speed(),
        "cpu": _cpu_model(),
        "logical_cpus": os.cpu_count(),
        "physical_cores": _physical_cores(),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "os": f"{platform.system()} {platform.release()} {platform.machine()}",
        "python": f"{platform.python_version()} ({platform.python_implementation()})",
        "shmq": _shmq_version(),
        "faster-fifo": _dist_version("faster-fifo"),
        "pyzmq": _zmq_version(),
        "redis-py": _dist_version("redis"),
        "posix_ipc": _dist_version("posix_ipc"),
        "redis-server": _redis_server_version(),
        "nats-py": _dist_version("nats-py"),
        "nats-server": _nats_server_version(),
        "iceoryx2": _dist_version("iceoryx2"),
        "pika": _dist_version("pika"),
        "rabbitmq-server": _rabbitmq_version(),
    }
