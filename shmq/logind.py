"""Whether systemd-logind would remove this user's shared memory, queues with it.

logind's ``RemoveIPC=`` (logind.conf; upstream's default is yes) removes the System V
and POSIX IPC objects of a user -- every /dev/shm entry, semaphores included -- when
the user's last session ends. System users are exempt (systemd's bound is fixed when it
is built, from SYS_UID_MAX in /etc/login.defs, so that file is the best guess at run
time), and so is a user with lingering on (``loginctl enable-linger``: their user
manager stays, they never fully log out). ``shmq doctor`` reports it (docs/OPERATIONS.md,
"Running under systemd"). Every path is taken under ``root``, so a test can hand a fake one.
"""

import os
import pwd

__all__ = ["check", "remove_ipc", "sys_uid_max"]

BOOTED = "run/systemd/system"  # sd_booted(): the host runs systemd
LOGIND_CONF = "etc/systemd/logind.conf"
DROPIN_DIRS = ("usr/lib/systemd/logind.conf.d", "usr/local/lib/systemd/logind.conf.d",
               "run/systemd/logind.conf.d", "etc/systemd/logind.conf.d")  # lowest precedence first
LOGIN_DEFS = "etc/login.defs"
LINGER_DIR = "var/lib/systemd/linger"
DEFAULT_SYS_UID_MAX = 999
_BOOLS = {"1": True, "yes": True, "y": True, "true": True, "t": True, "on": True,
          "0": False, "no": False, "n": False, "false": False, "f": False, "off": False}


def _conf_files(root) -> list[str]:
    """logind.conf, then its drop-ins by file name whatever their directory (a name in a
    later directory hides the same name in an earlier one), as systemd reads them."""
    dropins = {}
    for d in DROPIN_DIRS:
        try:
            names = os.listdir(os.path.join(root, d))
        except OSError:
            continue
        for name in names:
            if name.endswith(".conf"):
                dropins[name] = os.path.join(root, d, name)
    return [os.path.join(root, LOGIND_CONF)] + [dropins[n] for n in sorted(dropins)]


def remove_ipc(root="/") -> tuple[bool, str | None]:
    """logind's RemoveIPC= as the files under ``root`` set it: (the value, the file that
    set it, or None for the default, yes)."""
    value, source = True, None
    for path in _conf_files(root):
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                lines = f.read().splitlines()
        except OSError:
            continue
        section = None
        for line in lines:
            line = line.strip()
            if line.startswith("[") and line.endswith("]"):
                section = line[1:-1]
            elif section == "Login" and "=" in line and not line.startswith(("#", ";")):
                key, _, v = line.partition("=")
                if key.strip() == "RemoveIPC" and v.strip().lower() in _BOOLS:  # logind ignores a bad value
                    value, source = _BOOLS[v.strip().lower()], path
    return value, source


def sys_uid_max(root="/") -> int:
    """SYS_UID_MAX from login.defs under ``root`` (999 when absent)."""
    try:
        with open(os.path.join(root, LOGIN_DEFS), encoding="utf-8", errors="replace") as f:
            for line in f:
                words = line.split()
                if len(words) >= 2 and words[0] == "SYS_UID_MAX" and words[1].isdigit():
                    return int(words[1])
    except OSError:
        pass
    return DEFAULT_SYS_UID_MAX


def check(root="/", uid=None, user=None) -> dict:
    """What logind would do to the shared memory of ``uid`` (default: this process's
    user): ``systemd`` (the host runs it), ``remove_ipc`` and ``remove_ipc_source``,
    ``uid``, ``user``, ``sys_uid_max``, ``linger``, and ``warning``: a line when logind
    would remove the user's memory at their last logout, else None."""
    uid = os.geteuid() if uid is None else uid
    if user is None:
        try:
            user = pwd.getpwuid(uid).pw_name
        except KeyError:
            user = str(uid)
    systemd = os.path.isdir(os.path.join(root, BOOTED))
    removes, source = remove_ipc(root)
    bound = sys_uid_max(root)
    linger = os.path.exists(os.path.join(root, LINGER_DIR, user))
    warning = None
    if systemd and removes and uid > bound and not linger:
        where = source or f"{os.path.join(root, LOGIND_CONF)} (unset: the default)"
        warning = (f"logind removes the shared memory of user {user} (uid {uid} > SYS_UID_MAX {bound}, no "
                   f"lingering) when their last session ends: RemoveIPC=yes in {where}. Their queues would go "
                   f"with it: run the broker as a system user, set RemoveIPC=no, or `loginctl enable-linger "
                   f"{user}` (docs/OPERATIONS.md, Running under systemd)")
    return {"systemd": systemd, "remove_ipc": removes, "remove_ipc_source": source, "uid": uid, "user": user,
            "sys_uid_max": bound, "linger": linger, "warning": warning}
