"""``shmq status``: whether the namespace's server runs, and where it listens.

Strategy: the running broker writes who it is into its lock file (``server/lock.py``:
pid, start time, the DEADBEEF and Kafka addresses, TLS, token); this reads that file, as
``shmq namespace list`` does, so it needs no connection and no token."""

import time

import click

from ..engine.shm.names import default_namespace
from ..engine.shm.segment import check_namespace
from ..errors import ShmqError
from ..server.lock import holder
from .app import _echo_json, _json_option, main


def _address(host, port) -> str | None:
    if not port:
        return None
    return f"[{host}]:{port}" if host and ":" in host else f"{host}:{port}"


def server_status(namespace: str, now: float | None = None) -> dict:
    """What the lock file of ``namespace``'s broker says, for a live broker; ShmqError
    when none runs."""
    info = holder(check_namespace(namespace))
    if info is None or info.get("role", "broker") != "broker":
        raise ShmqError(f"no server runs for namespace {namespace!r} (start one: shmq server --namespace "
                        f"{namespace})")
    if not info["alive"]:
        raise ShmqError(f"no server runs for namespace {namespace!r}: its last one, pid {info['pid']}, is gone")
    started = info["start_ms"] / 1000
    now = time.time() if now is None else now
    return {"namespace": namespace, "running": True, "pid": info["pid"], "started_at": started,
            "uptime_s": max(0.0, round(now - started, 3)), "address": _address(info.get("host"), info.get("port")),
            "kafka_address": _address(info.get("kafka_host"), info.get("kafka_port")),
            "tls": info.get("tls"), "token": info.get("token"), "data_dir": info.get("data_dir")}


def _uptime(seconds: float) -> str:
    s = int(seconds)
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    return (f"{d}d " if d else "") + (f"{h}h " if d or h else "") + (f"{m}m " if d or h or m else "") + f"{s}s"


def _yes_no(value) -> str:
    return "unknown (an older server)" if value is None else ("yes" if value else "no")


@main.command("status")
@click.option("--namespace", default=default_namespace, show_default="$SHMQ_NAMESPACE or shmq",
              help="The namespace whose server to show.")
@_json_option
def status(namespace, as_json):
    """Whether the namespace's server runs: its pid, uptime, DEADBEEF and Kafka
    addresses, TLS. Exit 1 (one line on stderr) when no server runs."""
    st = server_status(namespace)
    if as_json:
        _echo_json(st)
        return
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(st["started_at"]))
    rows = [("namespace", namespace),
            ("server", f"running, pid {st['pid']}, up {_uptime(st['uptime_s'])} (since {started})"),
            ("deadbeef", st["address"] or "starting (no address yet)"),
            ("kafka", st["kafka_address"] or "off"),
            ("tls", _yes_no(st["tls"])),
            ("token", _yes_no(st["token"])),
            ("data dir", st["data_dir"] or "none (--no-persist)")]
    for what, value in rows:
        click.echo(f"{what:10s} {value}")
