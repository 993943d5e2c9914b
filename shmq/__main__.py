"""``python -m shmq``: the ``shmq`` command line."""

from .cli import main

main(prog_name="shmq")
