"""``python -m shmq.cli``."""

from . import main

main()
