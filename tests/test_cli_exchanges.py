"""``shmq exchange create|bind|unbind|list|publish|delete`` end to end, on both transports."""

import json

from tests.test_cli import shmq_cli, target  # noqa: F401  (the fixture: local and tcp)


def test_exchange_commands(target, broker):  # noqa: F811
    broker.create_queue("eu")
    broker.create_queue("all")
    assert shmq_cli("exchange", "create", "orders", "--type", "topic", *target).returncode == 0
    assert shmq_cli("exchange", "bind", "orders", "eu", "--pattern", "orders.eu.*", *target).returncode == 0
    assert shmq_cli("exchange", "bind", "orders", "all", *target).returncode == 0
    r = shmq_cli("exchange", "list", "--json", *target)
    assert json.loads(r.stdout) == [{"name": "orders", "type": "topic", "bindings": [
        {"target": "eu", "kind": "queue", "pattern": "orders.eu.*"},
        {"target": "all", "kind": "queue", "pattern": "#"}]}]
    r = shmq_cli("exchange", "list", *target)
    assert r.stdout == "orders\ttopic\tqueue eu (orders.eu.*), queue all (#)\n"
    r = shmq_cli("exchange", "publish", "orders", "-k", "orders.eu.paid", "-m", "a", "-m", "b", *target)
    assert (r.returncode, r.stdout) == (0, "2\n2\n")
    r = shmq_cli("exchange", "publish", "orders", "-k", "orders.us", "-m", "c", "--dedup-id", "c1", *target)
    assert (r.returncode, r.stdout) == (0, "1\n")
    assert broker.queue("eu").stats().ready == 2
    assert broker.queue("all").stats().ready == 3
    r = shmq_cli("exchange", "unbind", "orders", "eu", *target)
    assert (r.returncode, r.stdout) == (0, "1 binding(s) removed\n")
    assert shmq_cli("exchange", "delete", "orders", *target).returncode == 0
    assert shmq_cli("exchange", "list", "--json", *target).stdout == "[]\n"


def test_bad_input_is_one_line(target, broker):  # noqa: F811
    for args, text in [
        (["exchange", "publish", "nope", "-m", "x"], "shmq: error: no exchange 'nope'"),
        (["exchange", "bind", "nope", "q"], "shmq: error: no queue or stream 'q'"),
        (["exchange", "delete", "nope"], "shmq: error: no exchange 'nope'"),
        (["exchange", "create", "bad name!"], "shmq: error: invalid queue name"),
    ]:
        r = shmq_cli(*args, *target)
        assert r.returncode == 1, r
        assert r.stderr.startswith(text) and len(r.stderr.strip().splitlines()) == 1, r.stderr
    r = shmq_cli("exchange", "create", "x", "--type", "direct", *target)
    assert r.returncode == 2 and "Traceback" not in r.stderr
