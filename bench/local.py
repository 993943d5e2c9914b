"""The local matrix alone, without the durability modes or a plot: ``python -m bench.local``.

The options of ``python -m bench`` (``--systems``, ``--sizes``, ``--quick``, ``--runs``,
``--no-rtt``, ``--no-pin``, ...); the JSON only with ``--json PATH``; no streams
(``python -m bench.streams``).
"""

import sys

from bench.__main__ import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m bench.local", json=None, plot=None, durability=False, streams=False))
