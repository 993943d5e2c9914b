"""Sharing a namespace with a Unix group: its group, the modes, and who may use it.

Strategy: a namespace is owner-only (0600) unless its registry segment says otherwise.
One made with a group (``Broker.create_namespace(group=)``, ``shmq server --group``,
``shmq namespace create --group``) has a registry of mode 0660 owned by that group, and
every later create in it (queues, lanes, streams, partitions, semaphores, the exchange
table) copies that: the registry's mode and gid *are* the setting, read (one fstat)
by each create, never by an attach. A data dir shared with
a group is 2770 (setgid: what is made in it takes the group), and the files written in
it are 0660; anything else stays 0600 in a 0700 dir. Other users are refused by the
kernel, and that refusal becomes one line here (``refused``).
"""

import grp
import os
import stat

from .errors import ShmqError, Unauthorized

__all__ = ["FILE_MODE", "SHARED_FILE_MODE", "SHARED_DIR_MODE", "resolve_group", "group_name", "shared_gid",
           "share_fd", "share_path", "share_dir", "file_mode", "fit_to_dir", "check_deletable", "refused"]

FILE_MODE = 0o600  # owner-only: the default for memory and files
SHARED_FILE_MODE = 0o660  # owner and group
SHARED_DIR_MODE = 0o2770  # owner and group; setgid: files made in it take its group


def resolve_group(group: str | int) -> int:
    """The gid of ``group`` (a name or a number) that this process may give its files:
    ShmqError in one line if there is no such group or this user is not in it."""
    try:
        gid = group if isinstance(group, int) else (int(group) if str(group).isdigit() else grp.getgrnam(group).gr_gid)
        name = grp.getgrgid(gid).gr_name
    except (KeyError, TypeError, ValueError):
        raise ShmqError(f"no group {group!r} on this host (see getent group)") from None
    if os.geteuid() != 0 and gid != os.getegid() and gid not in os.getgroups():
        raise ShmqError(f"you (uid {os.geteuid()}) are not in group {name!r} (gid {gid}): add yourself with "
                        f"usermod -aG {name} $USER and log in again, or choose one of your groups (id -Gn)")
    return gid


def group_name(gid: int) -> str:
    """``name`` of ``gid``, else the number as text."""
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def shared_gid(st: os.stat_result) -> int | None:
    """The group a file (a registry segment, a data dir) is shared with, else None: its gid
    when the group may read and write it."""
    return st.st_gid if st.st_mode & 0o060 == 0o060 else None


def share_fd(fd: int, gid: int) -> None:
    """Give the open file ``fd`` to group ``gid``, mode 0660 (whatever the umask)."""
    os.fchown(fd, -1, gid)
    os.fchmod(fd, SHARED_FILE_MODE)


def share_path(path: str, gid: int) -> None:
    """``share_fd`` for a file with no descriptor of ours (a POSIX semaphore's)."""
    os.chown(path, -1, gid, follow_symlinks=False)
    os.chmod(path, SHARED_FILE_MODE)


def share_dir(path: str, gid: int) -> None:
    """Make (or convert) the data dir ``path`` for group ``gid``: 2770, and the files
    already in it that are ours 0660 with that group (the next writes keep them so)."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    os.chown(path, -1, gid)
    os.chmod(path, SHARED_DIR_MODE)
    uid = os.geteuid()
    with os.scandir(path) as entries:
        for entry in entries:
            if entry.is_file(follow_symlinks=False) and entry.stat(follow_symlinks=False).st_uid == uid:
                share_path(entry.path, gid)


def file_mode(path) -> int:
    """The mode a data file made at ``path`` takes: 0660 in a data dir shared with a group
    (``share_dir``: its group comes from the dir's setgid bit), else 0600."""
    try:
        st = os.stat(os.path.dirname(os.path.abspath(path)))
    except OSError:
        return FILE_MODE
    return SHARED_FILE_MODE if st.st_mode & stat.S_ISGID and shared_gid(st) is not None else FILE_MODE


def fit_to_dir(fd: int, path) -> None:
    """A data file just made at ``path`` (0600): 0660 if its dir is shared with a group."""
    mode = file_mode(path)
    if mode != FILE_MODE:
        os.fchmod(fd, mode)


def check_deletable(what: str, path: str) -> None:
    """Unauthorized, before anything changes, unless this user may unlink ``path`` (/dev/shm
    is sticky: only an entry's owner, or root, removes it): a member of a shared namespace
    deletes only what it made."""
    try:
        owner = os.stat(path).st_uid
    except FileNotFoundError:
        return
    me = os.geteuid()
    if owner != me and me != 0:
        raise Unauthorized(f"{what} is uid {owner}'s, not yours (uid {me}): in a namespace shared with a group "
                           "only its maker (or root) may delete it")


def refused(what: str, path: str) -> Unauthorized:
    """The one line for a PermissionError on ``what`` (a namespace, a queue) at ``path``."""
    try:
        st = os.stat(path)
        owner = f"uid {st.st_uid}'s, mode {stat.S_IMODE(st.st_mode):04o}"
        gid = shared_gid(st)
        if gid is not None:
            owner += f", shared with group {group_name(gid)!r} (gid {gid}), which you are not in"
    except OSError:
        owner = "another user's"
    return Unauthorized(f"{what} belongs to another user ({path} is {owner}): run as its owner, or ask for "
                        "the namespace to be shared with a group of yours (docs/OPERATIONS.md, Sharing with a group)")
