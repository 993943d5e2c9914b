"""The server's /dev/shm pressure lines (shmq/server/shmwatch.py): one WARNING as /dev/shm
runs short, one INFO once twice the threshold is free again, nothing in between however
often it looks."""

import logging

from shmq.server.shmwatch import ShmPressure


def test_one_line_per_episode(caplog):
    level = [100 * 2**20]
    watch = ShmPressure(low=1 * 2**20, free=lambda: level[0])
    with caplog.at_level(logging.INFO, logger="shmq.server"):
        for free in [100, 0.5, 0.2, 0.9, 1.5, 0.1, 2.5, 3, 0.4, 50]:  # MiB
            level[0] = int(free * 2**20)
            for _ in range(3):
                watch.check()
    said = [(r.levelname, r.event) for r in caplog.records]
    assert said == [("WARNING", "shm_pressure"), ("INFO", "shm_pressure_over"),
                    ("WARNING", "shm_pressure"), ("INFO", "shm_pressure_over")]
    assert "nearly full (512.0 KiB free)" in caplog.records[0].getMessage()
