"""The Kafka listener's state file, ``kafka-state.json`` (0600) in the data dir: its
format and its writing, reading and setting aside. What the state holds, and when it is
kept and taken back, is the listener's (``server/kafka/state.py``)."""

import json
import os

from .files import KAFKA_STATE_FILE, write_atomically

__all__ = ["VERSION", "state_path", "write_state", "read_state", "set_aside_state", "remove_state"]

VERSION = 1


def state_path(data_dir: str) -> str:
    return os.path.join(data_dir, KAFKA_STATE_FILE)


def write_state(data_dir: str, state: dict) -> str:
    """``state`` (JSON values) written with this format's version, atomically (temp file,
    fsync, rename); returns the path. OSError as it comes, with no temp file left."""
    path = state_path(data_dir)
    write_atomically(path, json.dumps({"version": VERSION, **state}).encode())
    return path


def read_state(data_dir: str) -> dict | None:
    """The state in ``data_dir`` (None: no file). OSError when it cannot be read,
    ValueError when it is not a state of this version."""
    try:
        with open(state_path(data_dir), "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return None
    state = json.loads(raw)
    if not isinstance(state, dict) or state.get("version") != VERSION:
        raise ValueError(f"version {state.get('version') if isinstance(state, dict) else None!r}, not {VERSION}")
    return state


def set_aside_state(data_dir: str) -> str:
    """Move a damaged state file aside (``.damaged``); returns where it went."""
    path = state_path(data_dir)
    aside = f"{path}.damaged"
    os.replace(path, aside)
    return aside


def remove_state(data_dir: str) -> None:
    os.unlink(state_path(data_dir))
