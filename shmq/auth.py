"""Who may use ``shmq server``: the token, where it lives, and how clients find it.

Strategy: safe by default, no configuration for the server's own user. The shared
memory segments are 0600, so the TCP front must not be more open than they are. At its
first start the server generates a token into a 0600 file of a per-user 0700
directory, ``$SHMQ_HOME`` (else ``$XDG_STATE_HOME/shmq``, else
``~/.local/state/shmq``), and reuses it afterwards (Erlang's cookie). Clients connect
by ``tcp://host:port`` only, so each running server with a token also writes a runtime
file there (Jupyter's), ``run/server-PORT-PID.json`` (0600): its addresses, port, pid,
start time and token. A client with no token reads the file for the port it reached,
and uses it only if the server that wrote it still runs (same pid and start time) and
the peer it reached is an address that server bound: the token never goes to another
user's server, or to another host. Other users cannot read the directory, so they get
UNAUTHORIZED. The server's default data dir is per user too (``data_root``:
$SHMQ_HOME/data, else $XDG_DATA_HOME/shmq, else ~/.local/share/shmq). This module is
the one owner of those locations and rules.
"""

import glob
import ipaddress
import json
import logging
import os
import secrets
import socket

from .errors import ShmqError, Unauthorized

__all__ = [
    "home", "default_token_file", "run_dir", "data_root", "default_data_dir", "load_or_create_token", "read_token",
    "server_token", "advertise", "withdraw", "discover", "client_token", "refused", "command_line_warning",
    "stale_runtime_files", "remove_stale_runtime_file",
]

log = logging.getLogger("shmq.server")

_PRIVATE = 0o077  # any group/other permission bit makes a token file unusable (like ssh keys)


# ---------------------------------------------------------------- locations
def home() -> str:
    """The per-user directory: $SHMQ_HOME, else $XDG_STATE_HOME/shmq, else ~/.local/state/shmq."""
    if os.environ.get("SHMQ_HOME"):
        return os.path.abspath(os.environ["SHMQ_HOME"])
    state = os.environ.get("XDG_STATE_HOME", "")
    if not os.path.isabs(state):  # the XDG spec: relative values are ignored
        state = os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(state, "shmq")


def default_token_file() -> str:
    """The token every server of this user shares unless told otherwise."""
    return os.path.join(home(), "token")


def run_dir() -> str:
    """Where running servers advertise themselves to their user's clients."""
    return os.path.join(home(), "run")


def data_root() -> str:
    """Where ``shmq server`` keeps each namespace's files unless told otherwise:
    $SHMQ_HOME/data when $SHMQ_HOME is set, else $XDG_DATA_HOME/shmq, else
    ~/.local/share/shmq."""
    if os.environ.get("SHMQ_HOME"):
        return os.path.join(home(), "data")
    data = os.environ.get("XDG_DATA_HOME", "")
    if not os.path.isabs(data):  # the XDG spec: relative values are ignored
        data = os.path.join(os.path.expanduser("~"), ".local", "share")
    return os.path.join(data, "shmq")


def default_data_dir(namespace: str) -> str:
    """The data dir of a ``shmq server`` of ``namespace`` given no --data-dir (nor
    --no-persist): ``data_root()/NAMESPACE``."""
    return os.path.join(data_root(), namespace)


def _private_dir(path):
    os.makedirs(path, mode=0o700, exist_ok=True)


def _write_new(path, data: bytes):
    """Write ``data`` to a fresh 0600 file beside ``path`` and return its name."""
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    return tmp


# ---------------------------------------------------------------- the token file
def read_token(path: str) -> str:
    """The token in ``path``; refused if the file is not yours alone or is empty."""
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())
        if st.st_uid != os.geteuid():
            raise ShmqError(f"token file {path} belongs to uid {st.st_uid}, not to you (uid {os.geteuid()})")
        if st.st_mode & _PRIVATE:
            raise ShmqError(f"token file {path} has mode {st.st_mode & 0o777:04o}: group or other users can access it; "
                            f"run chmod 600 {path}")
        token = f.read().decode("utf-8", "replace").strip()
    if not token or any(c.isspace() for c in token):
        raise ShmqError(f"token file {path} must hold one token: not empty, no spaces")
    return token


def load_or_create_token(path: str) -> str:
    """The token in ``path``, generated there (0600, atomically) if the file is missing."""
    try:
        return read_token(path)
    except FileNotFoundError:
        pass
    _private_dir(os.path.dirname(os.path.abspath(path)))
    tmp = _write_new(path, secrets.token_urlsafe(32).encode() + b"\n")
    try:
        os.link(tmp, path)  # never replaces: a server starting at the same time keeps its token
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp)
    return read_token(path)


def server_token(token=None, token_file=None, no_auth=False) -> tuple[str | None, str]:
    """The server's token (None: no auth) and how it was set up, for the start-up log.

    At most one of ``token``, ``token_file`` and ``no_auth``; none of them means the
    per-user default file, created at the first start.
    """
    if no_auth and (token or token_file):
        raise ValueError("--no-auth and a token (--token, --token-file) exclude each other")
    if token and token_file:
        raise ValueError("give --token or --token-file, not both")
    if no_auth:
        return None, "no auth (--no-auth): every local user can connect"
    if token:
        if any(c.isspace() for c in token):
            raise ValueError("the token must not contain spaces")
        return token, "token required (given at start)"
    path = os.path.abspath(token_file or default_token_file())
    try:
        return load_or_create_token(path), f"token required (file {path})"
    except ShmqError:
        raise
    except OSError as e:
        hint = "" if token_file else "; set $SHMQ_HOME, or pass --token-file or --no-auth"
        raise ShmqError(f"cannot use the token file {path}: {e.strerror or e}{hint}") from None


def command_line_warning(pid: int, alternatives="$SHMQ_TOKEN or --token-file") -> str:
    """What to say when a token came on the command line."""
    return (f"--token on the command line is readable by every user in /proc/{pid}/cmdline: "
            f"pass the token in {alternatives} instead")


# ---------------------------------------------------------------- runtime files
def _start_ticks(pid: int) -> int | None:
    """The process' start time (clock ticks since boot), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return int(stat[stat.rindex(b")") + 2:].split()[19])  # field 22; fields 1-2 end at ')'


def _bind_addresses(host, port) -> list[str]:
    """The addresses a server told to listen on ``host`` binds (as asyncio resolves it)."""
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror:
        return [host]
    return sorted({info[4][0] for info in infos})


def _ip(text):
    ip = ipaddress.ip_address(str(text).split("%", 1)[0])
    if ip.version == 6 and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def _runtime_files(port):
    return glob.glob(os.path.join(glob.escape(run_dir()), f"server-{int(port)}-*.json"))


def _read_runtime(path):
    try:
        with open(path, "rb") as f:
            info = json.load(f)
        return info if isinstance(info, dict) else None
    except (OSError, ValueError):
        return None


def _alive(info) -> bool:
    pid, start = info.get("pid"), info.get("start")
    return isinstance(pid, int) and pid > 0 and start is not None and _start_ticks(pid) == start


def advertise(port, host, namespace, token) -> str | None:
    """Tell this user's clients the token of the server on ``port`` (nothing without a
    token). Returns the runtime file to ``withdraw`` on stop; a failure is only logged."""
    if token is None:
        return None
    pid = os.getpid()
    info = {"pid": pid, "start": _start_ticks(pid), "host": host, "addresses": _bind_addresses(host, port),
            "port": port, "namespace": namespace, "token": token}
    path = os.path.join(run_dir(), f"server-{port}-{pid}.json")
    try:
        _private_dir(run_dir())
        for stale in glob.glob(os.path.join(glob.escape(run_dir()), "server-*.json")):
            if not _alive(_read_runtime(stale) or {}):
                withdraw(stale)
        os.replace(_write_new(path, json.dumps(info).encode()), path)
    except OSError as e:
        log.warning("clients will not find the token by themselves: cannot write %s: %s", path, e.strerror or e)
        return None
    return path


def withdraw(path) -> None:
    """Remove a runtime file (if any)."""
    if path:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def stale_runtime_files() -> list[dict]:
    """This user's runtime files whose server is gone (its pid dead, or another process's
    now: a SIGKILLed server leaves its file), as {path, pid, port, namespace, bytes}."""
    out = []
    for path in sorted(glob.glob(os.path.join(glob.escape(run_dir()), "server-*.json"))):
        info = _read_runtime(path)
        if info is not None and _alive(info):
            continue
        try:
            size = os.stat(path).st_size
        except FileNotFoundError:
            continue
        info = info or {}
        out.append({"path": path, "pid": info.get("pid"), "port": info.get("port"), "namespace": info.get("namespace"),
                    "bytes": size})
    return out


def remove_stale_runtime_file(path: str) -> bool:
    """Remove a runtime file whose server is (still) gone; False if it was not removed."""
    info = _read_runtime(path)
    if info is not None and _alive(info):
        return False
    try:
        os.unlink(path)
        return True
    except FileNotFoundError:
        return False


def _serves(info, peer, local) -> bool:
    """Whether the server of ``info`` is the one at ``peer`` (we reached it from ``local``)."""
    try:
        bound = {_ip(a) for a in info.get("addresses", ())}
    except ValueError:
        return False
    if peer in bound:
        return True
    on_this_host = peer.is_loopback or peer == local
    return on_this_host and any(a.is_unspecified for a in bound)


def discover(local_addr, peer_addr) -> tuple[str | None, str | None]:
    """The token (and the runtime file holding it) of this user's live server at
    ``peer_addr``, reached from ``local_addr``; (None, None) if there is none."""
    try:
        peer, local, port = _ip(peer_addr[0]), _ip(local_addr[0]), peer_addr[1]
    except (ValueError, IndexError, TypeError):
        return None, None
    for path in sorted(_runtime_files(port)):
        info = _read_runtime(path)
        if info and info.get("port") == port and isinstance(info.get("token"), str) and _alive(info) \
                and _serves(info, peer, local):
            return info["token"], path
    return None, None


def client_token(token, local_addr, peer_addr) -> tuple[str | None, str]:
    """The token a client presents, and where it came from: ``token`` if given, else
    $SHMQ_TOKEN, else the token of this user's server at ``peer_addr`` (see discover)."""
    if token is not None:
        return token, "the token given"
    if os.environ.get("SHMQ_TOKEN"):
        return os.environ["SHMQ_TOKEN"], "the token in $SHMQ_TOKEN"
    found, path = discover(local_addr, peer_addr)
    if found is not None:
        return found, f"the token in {path}"
    return None, ""


def refused(endpoint, source, error) -> Unauthorized:
    """A clear Unauthorized for a HELLO the server refused."""
    if source:
        return Unauthorized(f"{endpoint} refused {source}: {error}")
    return Unauthorized(f"{endpoint} requires a token ({error}) and none was found: pass token= (--token) or "
                        f"$SHMQ_TOKEN, or run the client as the server's user on its host (it reads {run_dir()})")
