"""``shmq doctor``: what shmq keeps on this host, and what of it is orphaned.

It reports the size and free space of /dev/shm (Docker gives a container 64 MB by
default; a queue holds there what its messages take, up to its ``max_bytes``, and a
warning says when what the queues and streams may grow to passes its size), every
namespace of the current user with its broker (alive or not, from the broker's lock
file), the entries no one can reach any more, and the data directories with their
disk space, and whether systemd-logind would remove the user's shared memory at their
last logout (``shmq.logind``). ``clean`` removes the orphans, and only what is provably one:

- in a namespace with a registry, an entry that no live queue or stream of the
  registry owns, and the files of a create or delete whose process died half-way
  (registry entries left CREATING or DELETING). Both are decided while holding the
  registry's lock, under which every create and delete runs: nothing can be made
  meanwhile, and a half-made entry seen under the lock has a dead maker;
- in a namespace with no registry (or only one its creator died before publishing,
  or that was never sized), every entry: no process can reach them through a registry.
  Cleaned while this process holds the namespace's registry name itself, unpublished
  (``registry.creation_guard``): no one can create the namespace meanwhile;
- a broker lock file whose holder is gone: removed while holding its lock;
- a server's runtime file (``$SHMQ_HOME/run/server-PORT-PID.json``) whose process is
  gone (dead, or its pid another process's now): a SIGKILLed broker leaves one.

Nothing of another user, nothing in a namespace whose broker runs but whose registry
is missing. A data directory is never an orphan: the one of a namespace that is not in
/dev/shm (destroyed before ``namespace destroy`` removed data dirs, or after a reboot,
when it holds the only copy) is named as such, and removed only when asked for
(``data_dirs=True``: ``--clean --data-dirs``), shmq's files only, while holding the
namespace's broker lock so that no server starts on it meanwhile. Everything here reads
/dev/shm directly and attaches only to registries that exist (never creating one).
"""

import errno
import fcntl
import os
import re
import time

import psutil

from . import logind
from .auth import data_root, remove_stale_runtime_file, stale_runtime_files
from .engine.shm import names
from .engine.shm.process import is_alive
from .engine.shm.registry import CREATING, DELETING, LIVE, Registry, creation_guard, read_header
from .engine.shm.segment import SHM_DIR, namespace_entries, unlink_segment
from .errors import LockTimeout
from .model.units import size_text
from .persistence.snapshotter import DEFAULT_DISK_FREE_LIMIT, DEFAULT_DISK_FREE_SHARE
from .server.lock import lock_name, read_holder

__all__ = ["diagnose", "clean", "problems", "render", "SMALL_SHM_BYTES"]

SMALL_SHM_BYTES = 256 * 2**20  # below this, /dev/shm holds few full default queues (64 MiB each)
LOW_FREE_FRACTION = 0.10
UNSIZED_AGE_S = 10.0  # a registry still zero-sized after this long: its creator died between open and size
REGISTRY_WAIT_S = 1.0  # the longest doctor waits for a namespace's registry lock
_NAMESPACE_RE = re.compile(r"^[A-Za-z0-9_-]{1,40}$")
_STREAM = names.STREAM_MARK
_NO_OWNER = "no queue or stream of its namespace's registry owns it"
_UNKNOWN = "no kind of shmq object has such a name (a newer or older shmq's?): kept"


# ------------------------------------------------------------------ /dev/shm
def _namespace_of(entry: str) -> str | None:
    """The namespace of a /dev/shm entry named like shmq's (``shmq.NS...``,
    ``sem.shmq.NS...``), else None."""
    name = entry[4:] if entry.startswith("sem.") else entry
    if not name.startswith("shmq."):
        return None
    ns = name[5:].split(".", 1)[0]
    return ns if _NAMESPACE_RE.match(ns) else None


def _entries(only=None):
    """{namespace: {entry: os.stat_result}} of every shmq entry in /dev/shm, and how many
    belong to other users (left out)."""
    me, out, others = os.geteuid(), {}, 0
    try:
        names = os.listdir(SHM_DIR)
    except FileNotFoundError:
        return out, others
    for entry in names:
        ns = _namespace_of(entry)
        if ns is None or (only and ns not in only):
            continue
        try:
            st = os.stat(os.path.join(SHM_DIR, entry), follow_symlinks=False)
        except FileNotFoundError:
            continue
        if st.st_uid != me:
            others += 1
            continue
        out.setdefault(ns, {})[entry] = st
    return out, others


def _taken(st) -> int:
    """The memory an entry takes (tmpfs: its allocated blocks)."""
    return st.st_blocks * 512


def _fs(path) -> dict:
    st = os.statvfs(path)
    return {"size": st.f_blocks * st.f_frsize, "free": st.f_bavail * st.f_frsize}


def _grows(namespace, entry) -> bool:
    """Whether ``entry`` is a queue's ring or a stream's partition: a segment that holds
    what its messages take, up to its size."""
    o = None if entry.startswith("sem.") else names.owner(namespace, entry)
    return o is not None and (o.kind.name == "queue" or (o.kind.name == "stream" and "#" in entry))


def _configured(entries) -> int:
    """What the queues and stream partitions among ``entries`` ({namespace: {entry: stat}})
    may grow to: their segments' sizes (each its header and ``max_bytes`` of ring; only
    what they hold is allocated)."""
    return sum(st.st_size for ns, found in entries.items() for e, st in found.items() if _grows(ns, e))


def shm_report(entries=None) -> dict:
    """Size and free space of /dev/shm, what this user's queues and streams hold there and
    may grow to (``entries``: {namespace: {entry: stat}}), with a warning when /dev/shm is
    small, nearly full, or smaller than what they may grow to."""
    try:
        fs = _fs(SHM_DIR)
    except OSError as e:
        return {"path": SHM_DIR, "size": 0, "free": 0, "warnings": [f"{SHM_DIR} is not usable: {e.strerror or e}"]}
    entries = entries or {}
    held = sum(_taken(st) for found in entries.values() for st in found.values())
    configured = _configured(entries)
    warnings = []
    if configured > fs["size"]:
        warnings.append(f"the queues and streams here may grow to {_mib(configured)} (their max_bytes), more than "
                        f"{SHM_DIR}'s {_mib(fs['size'])}: a put that needs room past it gets StorageError (what is "
                        "stored stays). Enlarge it (docker run --shm-size; Kubernetes: an emptyDir with medium: "
                        "Memory and a sizeLimit) or give them a smaller max_bytes")
    elif fs["size"] < SMALL_SHM_BYTES:
        warnings.append(f"{SHM_DIR} is small ({_mib(fs['size'])}; Docker's default is 64 MB): an empty queue takes "
                        "about 0.2 MiB, but one holds up to its max_bytes (64 MiB by default) of messages. Enlarge "
                        "it (docker run --shm-size=1g) for deep queues, or give them a smaller --max-bytes")
    if fs["size"] and fs["free"] < fs["size"] * LOW_FREE_FRACTION:
        warnings.append(f"{SHM_DIR} is {100 - 100 * fs['free'] // fs['size']}% full: puts that need more memory "
                        "may get StorageError")
    return {"path": SHM_DIR, **fs, "held": held, "configured": configured, "warnings": warnings}


# ------------------------------------------------------------------ one namespace
def _why_orphan(namespace, entry, live, half, broker_alive=False) -> str | None:
    """Why ``entry`` of a namespace whose registry lists ``live`` (names; a stream's
    ``@NAME``) and ``half`` ({index: (name, why)}: entries a dead process left half-made)
    is an orphan, or None if something lives that owns it (``names.owner``: the one table
    of what each kind of object owns)."""
    o = names.owner(namespace, entry)
    if o is None:
        return None  # not a name shmq makes: reported apart (``unknown``), never removed
    lives = o.kind.lives
    if lives == "registry":
        if o.name in live:
            return None
        return next((why for name, why in half.values() if name == o.name), _NO_OWNER)
    if lives == "process":
        return None if psutil.pid_exists(o.pid) else o.kind.gone
    if lives == "lock" and entry != lock_name(namespace):  # (the lock file itself: looked at apart)
        return None if broker_alive else o.kind.gone
    return None  # the namespace's own, a store's file, the broker's lock (looked at apart)


def _half_removed(namespace, live, entries, broker) -> list[dict]:
    """The queues and streams the registry lists live whose ring or meta segment is not
    in /dev/shm (``entries``): half removed, by hand or by a failure. Their messages in
    shared memory are gone; ``files``: what of them the namespace's data dir (its
    broker's, else the default one) still holds, which a server's start rebuilds them
    from."""
    from .auth import default_data_dir
    from .persistence.files import owner_of

    out = []
    for name in live:
        if name.startswith(_STREAM):
            kind, seg = "stream", names.stream_base(namespace, name[1:])
        else:
            kind, seg = "queue", names.queue_segment(namespace, name)
        if seg.lstrip("/") in entries:
            continue
        data_dir = (broker or {}).get("data_dir") or default_data_dir(namespace)
        try:
            files = sorted(e for e in os.listdir(data_dir) if owner_of(e) == name)
        except OSError:
            files = []
        out.append({"kind": kind, "name": name.lstrip(_STREAM), "entry": name, "missing": seg.lstrip("/"),
                    "data_dir": data_dir, "files": files, "mapped_by": _mapping(os.path.join(SHM_DIR, seg.lstrip("/")))})
    return out


def _mapping(path) -> list[int]:
    """The processes (this user's: /proc shows no more) that still map ``path``, unlinked:
    what they map of it lives on in them."""
    pids, me = [], os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/maps") as f:
                if any(line.rstrip("\n").endswith(f"{path} (deleted)") for line in f):
                    pids.append(int(entry))
        except OSError:
            continue
    return pids


def _lock_state(namespace, entries):
    """The broker of ``namespace`` from its lock file: (info or None, the lock entry if it is stale)."""
    lock = lock_name(namespace)
    if lock not in entries:
        return None, None
    info = read_holder(os.path.join(SHM_DIR, lock))
    if info is not None and info["alive"]:
        return info, None
    return info, lock  # a dead broker's (or an unwritten) lock file: the next start reuses it


def _registry_state(namespace, entries, now):
    """("ok" | "missing" | "foreign" | "dead-creator" | "unsized" | "creating", the
    registry entry if it is itself an orphan)."""
    reg = names.registry_segment(namespace).lstrip("/")
    try:
        st = os.stat(os.path.join(SHM_DIR, reg), follow_symlinks=False)
    except FileNotFoundError:
        return "missing", None
    if st.st_uid != os.geteuid():
        return "foreign", None
    header = read_header(namespace)
    if header is None:
        return "missing", None
    _size, published, pid, start = header
    if published:
        return "ok", None
    if pid and not is_alive(pid, start):
        return "dead-creator", reg
    if not pid and now - max(st.st_mtime, st.st_ctime) > UNSIZED_AGE_S:
        return "unsized", reg
    return "creating", None


def _examine(namespace, entries, now, remove=False) -> dict:
    """What ``namespace`` holds and which of its entries are orphans; with ``remove``,
    the orphans are removed as they are proved so (see the module's docstring)."""
    broker, stale_lock = _lock_state(namespace, entries)
    state, bad_registry = _registry_state(namespace, entries, now)
    ns = {"namespace": namespace, "entries": len(entries), "bytes": sum(_taken(st) for st in entries.values()),
          "registry": state, "queues": [], "streams": [], "broker": _broker_summary(broker), "note": None,
          "unknown": [], "half_removed": []}
    orphans = []

    def orphan(entry, reason):
        st = entries.get(entry)
        orphans.append({"entry": entry, "namespace": namespace, "reason": reason,
                        "bytes": _taken(st) if st is not None else 0})

    if state == "ok":
        try:
            registry = Registry(namespace, create=False)
        except FileNotFoundError:
            ns["note"] = "its registry went away while looking: look again"
            return {**ns, "orphans": []}
        except PermissionError:
            ns["note"] = "its registry belongs to another user"
            return {**ns, "orphans": []}
        try:
            with registry.held(REGISTRY_WAIT_S):
                if remove:  # under the lock: what is there now, not what was listed
                    entries = _entries({namespace})[0].get(namespace, {})
                used = registry.entries()
                live = [name for _i, st, name in used if st == LIVE]
                ns["queues"] = sorted(n for n in live if not n.startswith(_STREAM))
                ns["streams"] = sorted(n[1:] for n in live if n.startswith(_STREAM))
                half = {}
                for i, st, name in used:
                    if st in (CREATING, DELETING):
                        what = "create" if st == CREATING else "delete"
                        kind = "stream" if name.startswith(_STREAM) else "queue"
                        half[i] = (name, f"left by a {what} of {kind} {name.lstrip(_STREAM)!r} whose process died")
                ns["half_removed"] = _half_removed(namespace, live, entries, broker)
                for h in ns["half_removed"]:  # gone from memory, nowhere on disk: its entry is provably dead
                    if not h["files"] and not h["mapped_by"]:
                        i = next(i for i, st, name in used if st == LIVE and name == h["entry"])
                        half[i] = (h["entry"], f"left by {h['kind']} {h['name']!r}, half removed (its "
                                               f"{'ring' if h['kind'] == 'queue' else 'meta segment'} is gone)")
                for entry in sorted(entries):
                    if names.owner(namespace, entry) is None:
                        ns["unknown"].append(entry)
                        continue
                    reason = _why_orphan(namespace, entry, set(live) - {n for n, _w in half.values()}, half,
                                         broker is not None and broker["alive"])
                    if reason is not None:
                        orphan(entry, reason)
                if remove:
                    for o in orphans:
                        o["removed"] = _unlink(o["entry"])
                    for i, (name, _why) in half.items():
                        registry.free(i)  # under the lock a half-made entry's maker is dead: what was made is gone
                    for h in ns["half_removed"]:
                        h["removed"] = not h["files"] and not h["mapped_by"]
        except LockTimeout:
            ns["note"] = (f"its registry's lock stayed held for {REGISTRY_WAIT_S:g}s (a stopped process?): "
                          "not examined")
            orphans = []
        finally:
            registry.close()
    elif state == "creating":
        ns["note"] = "its registry is being created: look again"
    elif state == "foreign":
        ns["note"] = "its registry belongs to another user: not examined"
    elif broker is not None and broker["alive"]:
        ns["note"] = f"its registry is {state} but its broker (pid {broker['pid']}) runs: stop it first"
    else:
        why = {"missing": "its namespace has no registry",
               "dead-creator": "its namespace's registry was never published (its creator died)",
               "unsized": "its namespace's registry was never initialised (its creator died)"}[state]
        if bad_registry is not None:
            orphan(bad_registry, why.replace("its namespace's registry", "the registry"))
        for entry in sorted(entries):
            if entry not in (bad_registry, lock_name(namespace)):
                orphan(entry, why)
        if remove:
            _clean_registryless(namespace, orphans, bad_registry)
    if stale_lock is not None:
        orphan(stale_lock, "the lock file of a broker that is gone"
               + (f" (pid {broker['pid']})" if broker is not None else ""))
        if remove:
            orphans[-1]["removed"] = _unlink_stale_lock(namespace)
    return {**ns, "orphans": orphans}


def _broker_summary(info):
    if info is None:
        return None
    return {k: info.get(k) for k in ("pid", "alive", "host", "port", "kafka_host", "kafka_port", "data_dir",
                                     "snapshot_failing")}


def _unlink(entry) -> bool:
    if entry.startswith("sem."):
        path = os.path.join(SHM_DIR, entry)
        try:
            os.unlink(path)
            return True
        except FileNotFoundError:
            return False
    return unlink_segment("/" + entry)


def _clean_registryless(namespace, orphans, bad_registry):
    """Remove the entries of a namespace with no (usable) registry, holding its registry
    name so no one creates the namespace meanwhile."""
    if bad_registry is not None:
        for o in orphans:
            if o["entry"] == bad_registry:
                o["removed"] = _unlink_if_same(namespace, bad_registry, time.time())
    try:
        with creation_guard(namespace):
            for o in orphans:
                if "removed" not in o:
                    o["removed"] = _unlink(o["entry"])
    except FileExistsError:  # someone made the namespace's registry meanwhile: leave it all
        for o in orphans:
            o.setdefault("removed", False)


def _unlink_if_same(namespace, entry, now) -> bool:
    """Remove a registry whose creator died before publishing it (as ``Registry``
    does), once more found so just before."""
    entries = _entries({namespace})[0].get(namespace, {})
    if _registry_state(namespace, entries, now)[1] != entry:
        return False
    return _unlink(entry)


def _unlink_stale_lock(namespace) -> bool:
    """Remove a broker lock file no one holds (we hold it while we do)."""
    path = os.path.join(SHM_DIR, lock_name(namespace))
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        os.close(fd)
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return False  # a broker holds it now
        raise
    try:
        st, now = os.fstat(fd), os.stat(path)
        if (st.st_dev, st.st_ino) != (now.st_dev, now.st_ino):
            return False
        os.unlink(path)
        return True
    except FileNotFoundError:
        return False
    finally:
        os.close(fd)


# ------------------------------------------------------------------ data directories
def _dir_report(path, namespace=None, broker=None) -> dict:
    files, size = 0, 0
    try:
        with os.scandir(path) as it:
            for e in it:
                if e.is_file(follow_symlinks=False):
                    files += 1
                    size += e.stat(follow_symlinks=False).st_size
    except OSError as e:
        return {"path": path, "namespace": namespace, "error": e.strerror or str(e), "broker": broker}
    try:
        fs = _fs(path)
    except OSError:
        fs = {"size": 0, "free": 0}
    return {"path": path, "namespace": namespace, "files": files, "bytes": size, "disk_size": fs["size"],
            "disk_free": fs["free"], "broker": broker, "writable": os.access(path, os.W_OK | os.X_OK)}


def _runtime_orphans(only, remove) -> list[dict]:
    """The runtime files of servers that are gone, as orphans (removed with ``remove``)."""
    out = []
    for f in stale_runtime_files():
        if only is not None and f["namespace"] not in only:
            continue
        o = {"entry": f["path"], "namespace": f["namespace"], "bytes": f["bytes"],
             "reason": "the runtime file of a server that is gone"
                       + (f" (pid {f['pid']}, port {f['port']})" if f["pid"] else " (unreadable)")}
        if remove:
            o["removed"] = remove_stale_runtime_file(f["path"])
        out.append(o)
    return out


def _remove_data_dir(d) -> None:
    """Remove the data dir of a namespace that is not in /dev/shm (shmq's files only),
    holding the namespace's broker lock: no server starts on it meanwhile."""
    from .persistence import remove_data_dir

    ns = d["namespace"]
    path = os.path.join(SHM_DIR, lock_name(ns))
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except OSError:
        d["removed"] = False
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            d["removed"] = False  # a broker is starting on it
            return
        if namespace_entries(ns) != [lock_name(ns)]:  # made meanwhile
            d["removed"] = False
            return
        removed, kept = remove_data_dir(d["path"])
        d["removed"], d["kept"] = not kept, kept
        os.unlink(path)
    finally:
        os.close(fd)


def data_dirs(namespaces) -> list[dict]:
    """The default data dir of every namespace (``auth.data_root()``) and the data dirs
    of running brokers, each with its files and its disk's space, and ``exists``: whether
    its namespace is in /dev/shm."""
    seen, out = set(), []
    brokers = {ns["namespace"]: ns["broker"] for ns in namespaces if ns["broker"] and ns["broker"]["alive"]}
    for ns, b in sorted(brokers.items()):
        if b.get("data_dir"):
            path = os.path.abspath(b["data_dir"])
            seen.add(path)
            out.append(_dir_report(path, ns, b["pid"]))
    root = data_root()
    try:
        subdirs = sorted(e.name for e in os.scandir(root) if e.is_dir(follow_symlinks=False))
    except OSError:
        subdirs = []
    for name in subdirs:
        path = os.path.join(root, name)
        if path not in seen:  # no running broker uses it
            out.append(_dir_report(path, name))
    for d in out:
        d["exists"] = bool(d["namespace"] and namespace_entries(d["namespace"]))
    return out


# ------------------------------------------------------------------ the whole
def diagnose(namespaces=None, remove=False, remove_data_dirs=False) -> dict:
    """The report (a dict, as ``shmq doctor --json`` prints it): ``shm``, ``logind``
    (``shmq.logind.check``: would a logout remove this user's memory), ``namespaces``
    (each with its broker, queues, streams, orphans), ``orphans`` (all of them, the
    stale runtime files of servers included), ``data_dirs`` (each says whether its
    namespace ``exists``), ``other_users_entries``. ``namespaces``: only these (default:
    all of this user's). With ``remove``, the orphans are removed too (each says
    ``removed``); with ``remove_data_dirs``, the data dirs of namespaces not in /dev/shm."""
    only = set(namespaces) if namespaces else None
    entries, others = _entries(only)
    now = time.time()
    found = [_examine(ns, entries[ns], now, remove) for ns in sorted(entries)]
    dirs = [d for d in data_dirs(found) if only is None or d["namespace"] in only]
    if remove_data_dirs:
        for d in dirs:
            if not d["exists"] and d["namespace"] and "error" not in d:
                _remove_data_dir(d)
    return {
        "shm": shm_report(entries),
        "logind": logind.check(),  # whether a logout would remove this user's memory (shmq.logind)
        "namespaces": [{k: v for k, v in ns.items() if k != "orphans"} for ns in found],
        "orphans": [o for ns in found for o in ns["orphans"]] + _runtime_orphans(only, remove),
        "data_dirs": dirs,
        "other_users_entries": others,
    }


def clean(namespaces=None, data_dirs=False) -> dict:
    """``diagnose`` that removes what is provably orphaned (and, with ``data_dirs``, the
    data dirs of namespaces that are not in /dev/shm)."""
    return diagnose(namespaces, remove=True, remove_data_dirs=data_dirs)


def _mib(n) -> str:
    return f"{n / 2**20:.1f} MiB"


_REGISTRY_STATES = {"missing": "no registry", "foreign": "another user's registry",
                    "dead-creator": "a registry its creator died before publishing",
                    "unsized": "a registry never initialised", "creating": "its registry being created"}


def problems(report) -> list[str]:
    """What the report found that needs someone's hand, one line each (``shmq doctor``
    exits 1 when there is any): orphans and half-removed objects left in place, data dirs
    that cannot be written."""
    out = []
    left = [o for o in report["orphans"] if not o.get("removed")]
    if left:
        out.append(f"{len(left)} orphan(s) left: `shmq doctor --clean` removes them")
    for ns in report["namespaces"]:
        for h in ns.get("half_removed", ()):
            if not h.get("removed"):
                out.append(f"{h['kind']} {h['name']!r} of namespace {ns['namespace']} is half removed: "
                           + _half_advice(h))
    for ns in report["namespaces"]:
        b = ns["broker"]
        if b and b["alive"] and b.get("snapshot_failing"):
            out.append(f"the broker of namespace {ns['namespace']} (pid {b['pid']}) " + _failing_text(b))
    for d in report["data_dirs"]:
        if d.get("writable") is False:
            out.append(f"data dir {d['path']} cannot be written by this user: its server cannot snapshot or log")
        if _disk_low(d):
            out.append(f"data dir {d['path']}'s disk has {size_text(d['disk_free'])} free, below the disk alarm's "
                       "default threshold: free space there (docs/OPERATIONS.md, Disk alarm)")
    return out


def _disk_low(d) -> bool:
    """Whether a data dir's disk is below the disk alarm's default threshold."""
    return "error" not in d and d.get("disk_size", 0) > 0 and d.get("disk_free", 0) < min(
        DEFAULT_DISK_FREE_LIMIT, d["disk_size"] // DEFAULT_DISK_FREE_SHARE)


def _failing_text(b) -> str:
    f = b["snapshot_failing"]
    what = f.get("what") or {}
    first = next(iter(what.items()), ("", ""))
    return (f"cannot snapshot to {b.get('data_dir')} since {time.strftime('%H:%M:%S', time.localtime(f['since']))}: "
            f"{first[0]}: {first[1]}" + (f" (and {len(what) - 1} more)" if len(what) > 1 else ""))


def _half_advice(h) -> str:
    if h["files"]:
        return (f"its {'ring' if h['kind'] == 'queue' else 'meta segment'} is gone from {SHM_DIR}, and "
                f"{h['data_dir']} holds {len(h['files'])} file(s) of it: a server start rebuilds it from them")
    if h["mapped_by"]:
        return (f"its {'ring' if h['kind'] == 'queue' else 'meta segment'} is unlinked but still mapped by pid(s) "
                f"{', '.join(map(str, h['mapped_by']))}: kept while they run")
    return (f"its {'ring' if h['kind'] == 'queue' else 'meta segment'} is gone and no data dir holds it: "
            "`shmq doctor --clean` removes its registry entry")


def render(report) -> list[str]:
    """The report as lines of text."""
    shm = report["shm"]
    lines = [f"{shm['path']}: {size_text(shm['size'])}, {size_text(shm['free'])} free"
             + (f"; your queues and streams hold {size_text(shm['held'])}, may grow to {size_text(shm['configured'])}"
                if shm.get("configured") else "")]
    lines += [f"  warning: {w}" for w in shm["warnings"]]
    if (report.get("logind") or {}).get("warning"):
        lines.append(f"  warning: {report['logind']['warning']}")
    lines.append("")
    if not report["namespaces"]:
        lines.append("namespaces: none of yours in " + shm["path"])
    else:
        lines.append("namespaces (yours):")
        for ns in report["namespaces"]:
            b = ns["broker"]
            if b is None:
                broker = "no broker"
            elif b["alive"]:
                broker = f"broker pid {b['pid']}" + (f" on {b['host']}:{b['port']}" if b.get("port") else "")
            else:
                broker = f"broker pid {b['pid']} not running"
            what = f"{len(ns['queues'])} queue(s), {len(ns['streams'])} stream(s)" if ns["registry"] == "ok" \
                else _REGISTRY_STATES[ns["registry"]]
            lines.append(f"  {ns['namespace']:<20} {broker}; {what}; {ns['entries']} entries, {size_text(ns['bytes'])}")
            if ns["note"]:
                lines.append(f"  {'':<20} note: {ns['note']}")
            if b is not None and b["alive"] and b.get("snapshot_failing"):
                lines.append(f"  {'':<20} warning: it {_failing_text(b)}")
            for h in ns.get("half_removed", ()):
                mark = "" if "removed" not in h else ("  [removed]" if h["removed"] else "  [kept]")
                lines.append(f"  {'':<20} half removed: {h['kind']} {h['name']!r}: {_half_advice(h)}{mark}")
            if ns.get("unknown"):
                lines.append(f"  {'':<20} {len(ns['unknown'])} entries no kind of shmq object makes (a newer or "
                             f"older shmq's?), kept: {', '.join(ns['unknown'][:3])}{', ...' if len(ns['unknown']) > 3 else ''}")
    if report["other_users_entries"]:
        lines.append(f"  ({report['other_users_entries']} entries of other users not shown)")
    lines.append("")
    orphans = report["orphans"]
    if not orphans:
        lines.append("orphans: none")
    else:
        removed = [o for o in orphans if o.get("removed")]
        verb = "removed" if any("removed" in o for o in orphans) else "found"
        lines.append(f"orphans: {len(orphans)} {verb if verb == 'found' else ''}".rstrip()
                     + (f", {len(removed)} removed" if verb == "removed" else "")
                     + f" ({size_text(sum(o['bytes'] for o in orphans))})")
        for o in orphans:
            mark = "" if "removed" not in o else ("  [removed]" if o["removed"] else "  [kept]")
            lines.append(f"  {o['entry']}  {size_text(o['bytes'])}: {o['reason']}{mark}")
        if verb == "found":
            lines.append("  `shmq doctor --clean` removes them")
    lines.append("")
    if not report["data_dirs"]:
        lines.append(f"data directories: none under {data_root()}")
    else:
        lines.append("data directories:")
        for d in report["data_dirs"]:
            if "error" in d:
                lines.append(f"  {d['path']}: {d['error']}")
                continue
            used_by = f"; broker pid {d['broker']}" if d.get("broker") else ""
            mark = ""
            if "removed" in d:
                mark = "  [removed]" if d["removed"] else (
                    f"  [kept: {', '.join(d['kept'])} not shmq's]" if d.get("kept") else "  [kept]")
            lines.append(f"  {d['path']}: {d['files']} file(s), {size_text(d['bytes'])}{used_by}; disk "
                         f"{size_text(d['disk_free'])} free of {size_text(d['disk_size'])}{mark}")
            if d.get("writable") is False:
                lines.append("    warning: this user cannot write it: its server cannot snapshot or log there")
            if _disk_low(d):
                lines.append("    warning: its disk has less free space than the disk alarm's default threshold (50 MiB, "
                             "or a twentieth of the disk): a server refuses puts to 'wal' queues there")
            if not d["exists"] and d["namespace"] and not d.get("removed"):
                ns = d["namespace"]
                lines.append(f"    no namespace {ns} in {SHM_DIR} (destroyed, or a reboot): `shmq server --namespace "
                             f"{ns}` would rebuild it from here; `shmq namespace destroy {ns} --yes` removes it")
        gone = [d for d in report["data_dirs"] if not d["exists"] and d["namespace"] and "removed" not in d]
        if len(gone) > 1:
            lines.append("  `shmq doctor --clean --data-dirs` removes the data dirs of every namespace not in "
                         f"{SHM_DIR}")
    return lines


