"""/dev/shm pressure, said once per episode: the server looks at /dev/shm's free space each
housekeeping tick and logs a WARNING when it runs short (puts that need room there wait
within their timeout, then get ShmFull; appends get it at once) and an INFO when room is
back, never a line per refused put.

Strategy: one ``statvfs`` a tick (microseconds). Short means less than ``LOW`` free, a few
chunks: what one queue's next growth may want (``layout.CHUNK``); the episode ends once
twice that is free again, so a level hovering at the edge is not said over and over.
"""

import logging

from ..engine.shm import layout as L
from ..engine.shm.segment import SHM_DIR, free_bytes
from ..model.units import size_text

__all__ = ["ShmPressure", "LOW"]

log = logging.getLogger("shmq.server")

LOW = 8 * L.CHUNK  # free below this: an episode of pressure starts


class ShmPressure:
    """``check()`` once a tick; ``short``: whether an episode is under way."""

    def __init__(self, low: int = LOW, free=free_bytes):
        self.low, self._free, self.short = low, free, False

    def check(self) -> None:
        try:
            free = self._free()
        except OSError:
            return
        if not self.short and free < self.low:
            self.short = True
            log.warning("%s is nearly full (%s free): puts that need room there wait within their timeout, then "
                        "get ShmFull, and appends get it at once; consume, purge or delete messages, or enlarge it "
                        "(Docker: --shm-size)", SHM_DIR, size_text(free),
                        extra={"event": "shm_pressure", "free_bytes": free})
        elif self.short and free >= 2 * self.low:
            self.short = False
            log.info("%s has room again (%s free)", SHM_DIR, size_text(free),
                     extra={"event": "shm_pressure_over", "free_bytes": free})
