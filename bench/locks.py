"""Lock candidates for the queue mutex, measured side by side: ``python -m bench.locks``.

Prints ns per lock+unlock pair (median of 5 runs) for a POSIX semaphore (not robust),
the robust pthread mutex shmq uses, and an fcntl OFD lock.
"""

import ctypes
import fcntl
import mmap
import os
import statistics
import struct
import tempfile
import time

import posix_ipc

from shmq.engine.shm.mutex import RobustMutex, init_mutex

N = 200_000
F_OFD_SETLKW = 38  # Linux


def _time(fn, n):
    runs = []
    for _ in range(5):
        t = time.perf_counter()
        fn(n)
        runs.append((time.perf_counter() - t) / n * 1e9)
    return statistics.median(runs)


def bench_semaphore(n):
    sem = posix_ipc.Semaphore(None, posix_ipc.O_CREX, initial_value=1)
    try:
        acquire, release = sem.acquire, sem.release
        return _time(lambda k: [(acquire(), release()) for _ in range(k)], n)
    finally:
        sem.unlink()


def bench_robust_mutex(n):
    buf = mmap.mmap(-1, 4096)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    init_mutex(addr)
    m = RobustMutex(addr)
    acquire, release = m.acquire, m.release
    return _time(lambda k: [(acquire(), release()) for _ in range(k)], n)


def bench_ofd_lock(n):
    with tempfile.TemporaryFile() as f:
        fd = f.fileno()
        lock = struct.pack("hhqqi", fcntl.F_WRLCK, os.SEEK_SET, 0, 1, 0)
        unlock = struct.pack("hhqqi", fcntl.F_UNLCK, os.SEEK_SET, 0, 1, 0)
        return _time(lambda k: [(fcntl.fcntl(fd, F_OFD_SETLKW, lock), fcntl.fcntl(fd, F_OFD_SETLKW, unlock))
                                for _ in range(k)], n // 10)


def main():
    print("lock + unlock, ns (median of 5)")
    for name, fn in [("posix_ipc semaphore (not robust)", bench_semaphore),
                     ("robust pthread mutex via ctypes (shmq)", bench_robust_mutex),
                     ("fcntl OFD lock", bench_ofd_lock)]:
        print(f"  {name:42s} {fn(N):8.0f}")


if __name__ == "__main__":
    main()
