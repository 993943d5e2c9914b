"""The log lines of ``shmq server``: text or JSON, one line per event, with its fields.

Strategy: the stdlib's logging, nothing else. An event is a log call whose ``extra``
names it and carries its fields::

    log.info("connection closed", extra={"event": "connection_closed", "peer": "127.0.0.1:5555",
                                         "requests": 12, "reason": "eof"})

``--log-format json`` writes one JSON object per line: ``time``, ``level``, ``logger``,
``message``, then the fields (``event`` and the rest; a traceback as ``exc``). Every line
has an ``event``: one that names none (a library's record, asyncio's, a Python warning)
gets ``log``, and its ``logger`` says whose it is.
``--log-format text`` writes ``TIME shmq LEVEL message k=v k=v``: the same fields,
logfmt-style (a value with spaces or quotes is JSON-quoted), so a line stays one line.
"""

import datetime
import json
import logging
import sys

__all__ = ["JsonFormatter", "TextFormatter", "configure", "peer_text", "FORMATS", "PLAIN_EVENT"]

FORMATS = ("text", "json")
PLAIN_EVENT = "log"  # the event of a line that names none of its own

# every attribute a LogRecord has of its own: whatever else it carries came in ``extra``
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime", "taskName"}


def _fields(record) -> dict:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD}


def _value_text(v) -> str:
    if isinstance(v, str):
        return v if v and not any(c.isspace() or c in "\"=" for c in v) else json.dumps(v)
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, (list, tuple, dict)):
        return json.dumps(v, default=str, separators=(",", ":"))
    return str(v)


class TextFormatter(logging.Formatter):
    """``2026-11-22 12:00:00,123 shmq INFO connection closed peer=127.0.0.1:5555 requests=12``."""

    def __init__(self):
        super().__init__("%(asctime)s shmq %(levelname)s %(message)s")

    def format(self, record):
        line = super().format(record)
        fields = {k: v for k, v in _fields(record).items() if k != "event"}
        if not fields:
            return line
        head, sep, tail = line.partition("\n")  # a traceback, if any, stays below the line
        return head + " " + " ".join(f"{k}={_value_text(v)}" for k, v in fields.items()) + sep + tail


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message and the event's fields."""

    def format(self, record):
        out = {
            "time": datetime.datetime.fromtimestamp(record.created).astimezone().isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = _fields(record)
        out["event"] = fields.pop("event", None) or PLAIN_EVENT
        for k, v in fields.items():
            out.setdefault(k, v)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, ensure_ascii=False)


def configure(level: str = "info", fmt: str = "text", stream=None) -> None:
    """Send every log record of the process to ``stream`` (stderr) at ``level`` and
    above, one line each, as ``fmt`` (text | json)."""
    if fmt not in FORMATS:
        raise ValueError(f"the log format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(level.upper())
    logging.captureWarnings(True)  # a Python warning is a line of the log too, not text beside it


def peer_text(peer) -> str:
    """A socket address as ``host:port`` (``[v6]:port``); anything else as text."""
    if isinstance(peer, tuple) and len(peer) >= 2:
        host, port = peer[0], peer[1]
        return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
    return str(peer)
