"""Running a program (a Spark driver) in a session of its own: its output, and whatever it
leaves running (Spark's JVM and Python daemons leave the process group, not the session)
killed afterwards, pass or fail."""

import os
import subprocess

import psutil

__all__ = ["run_in_session"]


def run_in_session(args, timeout, **popen):
    """(the finished Popen, stdout, stderr) of ``args`` run in a new session, every process
    of that session killed at the end."""
    p = subprocess.Popen(args, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         **popen)
    try:
        out, err = p.communicate(timeout=timeout)
    finally:
        left = [q for q in psutil.process_iter() if _sid(q.pid) == p.pid]
        for q in left:
            q.kill()
        psutil.wait_procs(left, timeout=30)
    return p, out, err


def _sid(pid):
    try:
        return os.getsid(pid)
    except OSError:
        return None
