"""Compiles and runs the JVM connector's main-based Java tests (shmq/spark/jvm/test) from pytest.

Strategy: there is no JUnit and no build tool here, only the JDK. A test class is a ``main``
that throws (exit 1) when a check fails and prints what the Python side compares. ``compile_tests``
hands javac every test file at once, with the connector's sources on ``-sourcepath`` (so the classes
the tests use), once a run: into a folder named by the files' hash, which the run's xdist workers
share (one javac, 6 CPU-s, where one per module cost 5.5 each); pyspark's jars are on the class path
for the parts that need Spark, and the defaults jar() writes into the jar beside the classes.
"""

import fcntl
import glob
import hashlib
import os
import shutil
import subprocess
import tempfile

import pytest

from shmq.spark.jar import DEFAULTS
from shmq.spark.options import jvm_defaults
from shmq.spark.session import java_home
from tests.spark.cds import OPTIONS

__all__ = ["JVM", "SRC", "TEST", "javac", "skip_without_jdk", "compile_tests", "java_command", "run_java"]

JVM = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "shmq", "spark", "jvm")
SRC, TEST = os.path.join(JVM, "src"), os.path.join(JVM, "test")
COMPILE_TIMEOUT_S = 300  # a loaded 2-core machine compiles slowly


def javac() -> str | None:
    """The JDK's javac (beside the ``java`` that Spark uses, else on PATH), or None."""
    home = java_home()
    if home and os.path.exists(os.path.join(home, "bin", "javac")):
        return os.path.join(home, "bin", "javac")
    return shutil.which("javac")


def skip_without_jdk() -> str:
    """javac's path, or skips the test saying why."""
    path = javac()
    if path is None:
        pytest.skip("the JVM connector's tests need a JDK (javac): set JAVA_HOME or install openjdk-17-jdk-headless")
    return path


def _spark_jars() -> list[str]:
    try:
        import pyspark
    except ImportError:
        return []
    return sorted(glob.glob(os.path.join(os.path.dirname(pyspark.__file__), "jars", "*.jar")))


def java_command(classpath: str, main: str, *args, flags=None) -> list[str]:
    """The command that runs class ``main`` with ``args``, for a test that runs it itself
    (``run_java`` waits for it). ``flags`` for the JVM; None: cds.OPTIONS, a short-lived
    JVM's (the torn reads give theirs: the tiered JIT's compiled code is what they test)."""
    java = os.path.join(os.path.dirname(skip_without_jdk()), "java")
    return [java, *(OPTIONS.split() if flags is None else flags), "-ea", "-cp", classpath, main, *map(str, args)]


def compile_tests(folder) -> str:
    """Compile every test under shmq/spark/jvm/test and the sources they use into ``folder``
    (a subfolder named by their hash: done once, the first caller building under a lock while
    the others wait); returns the class path to run them with. Fails the test with javac's
    output when they do not compile."""
    tool = skip_without_jdk()
    files = sorted(glob.glob(os.path.join(TEST, "**", "*.java"), recursive=True))
    digest = hashlib.sha256(jvm_defaults().encode())
    for path in files + sorted(glob.glob(os.path.join(SRC, "**", "*.java"), recursive=True)):
        with open(path, "rb") as f:
            digest.update(path.encode() + b"\0" + f.read() + b"\0")
    out_dir = os.path.join(str(folder), "classes-" + digest.hexdigest()[:16])
    jars = _spark_jars()
    classpath = os.pathsep.join([out_dir] + jars)
    fd = os.open(os.path.join(str(folder), "lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        if not os.path.isdir(out_dir):
            part = tempfile.mkdtemp(dir=str(folder), prefix=".javac-")
            cmd = [tool, *(f"-J{o}" for o in OPTIONS.split()), "--release", "17", "-Xlint:all,-path", "-Werror",
                   "-proc:none", "-implicit:class", "-encoding", "UTF-8", "-d", part, "-sourcepath",
                   os.pathsep.join([SRC, TEST]), "-cp", os.pathsep.join([part] + jars), *files]
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
            if done.returncode != 0:
                shutil.rmtree(part, ignore_errors=True)
                pytest.fail(f"javac failed:\n{done.stdout}{done.stderr}")
            defaults = os.path.join(part, DEFAULTS)  # what jar() writes into the jar beside the classes
            os.makedirs(os.path.dirname(defaults), exist_ok=True)
            with open(defaults, "w") as f:
                f.write(jvm_defaults())
            os.rename(part, out_dir)
    finally:
        os.close(fd)
    return classpath


def run_java(classpath: str, main: str, *args, timeout: float = 120.0, check: bool = True,
             stdin=subprocess.DEVNULL) -> subprocess.CompletedProcess:
    """Run class ``main`` with ``args``; its stdout and stderr as text. With ``check``, fails the
    test with both when it exits other than 0."""
    done = subprocess.run(java_command(classpath, main, *args), capture_output=True, text=True, timeout=timeout,
                          stdin=stdin)
    if check:
        assert done.returncode == 0, f"{main} exited {done.returncode}:\n{done.stdout[-4000:]}{done.stderr[-4000:]}"
    return done
