"""Every setting has one row (shmq/model/settings.py), and every face reads it: the
engine's and the TCP clients' signatures, the protocol's field table, the Kafka
listener's topic configs, the CLI; and what a queue or stream made with no settings
has, locally and over TCP, is the table's defaults."""

import inspect

import click
import pytest

import shmq

from shmq.cli.app import main
from shmq.client.core import BrokerCalls
from shmq.engine import broker as engine_broker
from shmq.engine.broker import Broker
from shmq.model import settings as S
from shmq.protocol import MsgType
from shmq.protocol.requests import _WIRE_CHECKS, REQUEST_FIELDS
from shmq.server.kafka.configs import CONFIGS

TABLES = {"queue": S.QUEUE_TABLE, "stream": S.STREAM_TABLE}
NOT_SETTINGS = {"self", "name", "exist_ok", "serializer"}  # a create's other parameters


def _params(fn) -> dict:
    return {k: p.default for k, p in inspect.signature(fn).parameters.items() if k not in NOT_SETTINGS}


@pytest.mark.parametrize("kind", TABLES)
def test_the_signatures_are_the_tables(kind):
    table = TABLES[kind]
    method = f"create_{kind}"
    assert _params(getattr(Broker, method)) == {s.name: s.default for s in table}
    assert _params(getattr(BrokerCalls, method)) == {s.name: s.remote_default for s in table}
    assert [s.name for s in table if s.remote is not S.SAME] == (["durability"] if kind == "queue" else [])


def test_live_and_fixed_are_the_tables():
    assert engine_broker.MUTABLE_QUEUE_SETTINGS + engine_broker.FIXED_QUEUE_SETTINGS == tuple(
        sorted((s.name for s in S.QUEUE_TABLE), key=lambda n: not S.QUEUE.rows[n].mutable))
    assert set(engine_broker.STREAM_SETTINGS) == {s.name for s in S.STREAM_TABLE}
    assert engine_broker.MUTABLE_STREAM_SETTINGS == tuple(s.name for s in S.STREAM_TABLE if s.mutable)
    assert "visibility_timeout" in S.MUTABLE_QUEUE_SETTINGS and "max_bytes" in S.FIXED_QUEUE_SETTINGS
    assert "partitions" in S.MUTABLE_STREAM_SETTINGS and "retention" in S.FIXED_STREAM_SETTINGS


@pytest.mark.parametrize("kind, msg_type", [("queue", MsgType.CREATE), ("stream", MsgType.STREAM_CREATE)])
def test_the_wire_fields_are_the_tables(kind, msg_type):
    fields = {f.name: f for f in REQUEST_FIELDS[msg_type]}
    for s in TABLES[kind]:
        assert fields[s.wire_field].check is _WIRE_CHECKS[s.wire], s.name
    others = set(fields) - {s.wire_field for s in TABLES[kind]}
    assert others == ({"queue", "exist_ok", "declare", "update", "clear"} if kind == "queue" else {"stream", "exist_ok"})


def test_the_kafka_configs_are_the_stream_table():
    named = {s.kafka: s for s in S.STREAM_TABLE if s.kafka}
    assert {k: c.setting for k, c in CONFIGS.items() if c.setting} == {k: s.name for k, s in named.items()}
    for k, s in named.items():
        assert CONFIGS[k].default == s.default, k
    assert len(set(named)) == len(named) and all(s.mutable for s in named.values())  # (a topic config may change)


def _command(*path) -> click.Command:
    cmd = main
    for word in path:
        cmd = cmd.get_command(click.Context(cmd), word)
    return cmd


@pytest.mark.parametrize("kind, path", [("queue", ("create",)), ("stream", ("stream", "create"))])
def test_the_create_commands_are_the_tables(kind, path):
    options = {o.name: o for o in _command(*path).params if isinstance(o, click.Option)}
    for s in TABLES[kind]:
        if not s.cli:
            assert s.name not in options, s.name
            continue
        o = options[s.name]
        assert s.flag in o.opts, s.name
        if o.is_flag:  # (absent: false, the default of every flag-like setting)
            assert s.default is False, s.name
        elif o.default is not None:  # (None: the engine's default, which the help text shows)
            assert o.type.convert(o.default, o, None) == s.default, s.name
    rows = {s.name for s in TABLES[kind]}
    assert set(options) - rows <= {"namespace", "url", "token", "exist_ok", "as_json"}


@pytest.mark.parametrize("kind, path", [("queue", ("queue", "set")), ("stream", ("stream", "set"))])
def test_the_set_commands_name_only_settings(kind, path):
    rows = S.QUEUE.rows if kind == "queue" else S.STREAM.rows
    options = {o.name for o in _command(*path).params if isinstance(o, click.Option)}
    mine = options - {"namespace", "url", "token", "as_json"}
    assert mine and all(n in rows for n in mine), mine - set(rows)
    if kind == "stream":  # (what the stream command offers it can change)
        assert all(rows[n].mutable for n in mine)


@pytest.fixture
def both(broker, tcp_server):
    """The test's namespace, attached locally and over TCP."""
    with shmq.connect(tcp_server.url) as remote:
        yield [broker, remote]


def test_a_queue_made_with_no_settings_has_the_tables_defaults(both, broker):
    want = {s.name: s.default for s in S.QUEUE_TABLE}
    want["max_message_bytes"] = 2**20  # (None: 1 MiB, the ring allowing)
    for i, b in enumerate(both):
        assert b.create_queue(f"defaults{i}").settings() == want
    assert broker.queue("defaults1").settings() == want


def test_a_stream_made_with_no_settings_has_the_tables_defaults(both, broker):
    want = {s.name: s.default for s in S.STREAM_TABLE}
    for i, b in enumerate(both):
        b.create_stream(f"defaults{i}")
        assert engine_broker.stream_settings(broker.stream(f"defaults{i}")) == want


@pytest.mark.parametrize("kind", TABLES)
def test_a_duration_in_seconds_is_held_in_whole_nanoseconds_and_refused_as_a_string(broker, kind):
    """The table's ``seconds`` rows: a queue or stream made with each holds it as the number
    of seconds asked (to the nanosecond; priority_aging and expires to the millisecond), and
    a string for one is refused, naming it, locally, and a queue option's before a CREATE is
    sent."""
    from shmq.protocol import payloads

    rows = [s for s in TABLES[kind] if s.seconds]
    assert {s.name for s in rows} == (S.QUEUE_SECONDS if kind == "queue" else S.STREAM_SECONDS)
    create = getattr(broker, f"create_{kind}")
    for i, s in enumerate(rows):
        obj = create(f"d{i}", **{s.name: 12.5})
        held = obj.settings() if kind == "queue" else engine_broker.stream_settings(obj)
        assert held[s.name] == 12.5, s.name
        with pytest.raises(TypeError, match=s.name):  # a type's error, on every seconds row alike
            create(f"e{i}", **{s.name: "12.5"})
    if kind == "queue":  # the options CREATE sends as given: their type checked before sending
        options = {s.name for s in rows} & set(payloads.QUEUE_OPTIONS)
        assert options == payloads._SECONDS_OPTIONS
        for name in options:
            with pytest.raises(TypeError, match="number of seconds"):
                payloads.create_fields("q", 1 << 20, None, 30.0, None, None, False, **{name: "12.5"})
