"""TLS (issue 31, item 1): ``shmq server --tls-cert --tls-key [--tls-client-ca]`` on the
DEADBEEF port and the Kafka port, and every client over ``tcps://``: blocking, asyncio,
fork and reconnect, the CLI, kombu (Celery) and Dramatiq, a Kafka client over SASL_SSL.

A throwaway CA (and a second, wrong one), a server certificate for 127.0.0.1 and a
client certificate are made once per session with the ``openssl`` command.
"""

import asyncio
import multiprocessing
import os
import re
import shutil
import ssl
import subprocess
import sys
import threading
import uuid
from types import SimpleNamespace

import pytest

import shmq
from shmq.errors import BrokerUnavailable
from tests.test_cli import shmq_cli

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")

_VERIFY_FAILED = r"cannot connect to 127\.0\.0\.1:\d+: TLS certificate verify failed: unable to get local issuer"
_SET_THE_CA = (r" the server's certificate: set \$SHMQ_TLS_CA to the CA file that did, or give ssl= a context that "
               r"trusts it\)$")


def _openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _ca(d, name):
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2",
             "-subj", f"/CN={name}", "-keyout", f"{name}.key", "-out", f"{name}.pem", cwd=d)


def _signed(d, name, ca, ext):
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-subj", f"/CN={name}",
             "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=d)
    with open(os.path.join(d, f"{name}.ext"), "w") as f:
        f.write(ext)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key", "-CAcreateserial",
             "-days", "2", "-out", f"{name}.pem", "-extfile", f"{name}.ext", cwd=d)


@pytest.fixture(scope="session")
def certs(tmp_path_factory):
    """Paths: ``ca``, ``other_ca`` (signs nothing of ours), ``cert``/``key`` (the server's,
    for 127.0.0.1 and localhost), ``client_cert``/``client_key`` (signed by ``ca``)."""
    d = str(tmp_path_factory.mktemp("tls"))
    _ca(d, "ca")
    _ca(d, "other_ca")
    _signed(d, "server", "ca", "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n")
    _signed(d, "client", "ca", "extendedKeyUsage=clientAuth\n")
    p = lambda name: os.path.join(d, name)  # noqa: E731
    return SimpleNamespace(ca=p("ca.pem"), other_ca=p("other_ca.pem"), cert=p("server.pem"), key=p("server.key"),
                           client_cert=p("client.pem"), client_key=p("client.key"), dir=d)


@pytest.fixture
def tls_env(monkeypatch, certs):
    """Clients trust the test CA through $SHMQ_TLS_CA (child processes too)."""
    monkeypatch.setenv("SHMQ_TLS_CA", certs.ca)
    for name in ("SHMQ_TLS_CERT", "SHMQ_TLS_KEY"):
        monkeypatch.delenv(name, raising=False)
    return certs


@pytest.fixture
def tls_server(broker, servers, tls_env):
    """``start(*args)``: a real ``shmq server`` with TLS (``.tls_url``: its tcps:// url)."""
    started = []

    def start(*args):
        srv = servers(broker.namespace, "--no-persist", "--tls-cert", tls_env.cert, "--tls-key", tls_env.key, *args)
        srv.tls_url = f"tcps://127.0.0.1:{srv.port}"
        started.append(srv)
        return srv

    yield start
    for srv in started:
        assert srv.stop() == 0


def _context(ca, cert=None, key=None):
    ctx = ssl.create_default_context(cafile=ca)
    if cert:
        ctx.load_cert_chain(cert, key)
    return ctx


# ---------------------------------------------------------------------- the DEADBEEF port
@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_blocking_client_puts_and_gets_over_tls(tls_server, loop):
    srv = tls_server("--loop", loop)
    assert any("TLS on every port" in line for line in srv.log)
    with shmq.connect(srv.tls_url) as b:
        q = b.create_queue("jobs")
        q.put_many([b"a" * 10, b"b" * 100_000])  # one body larger than a TLS record
        got = [q.get(timeout=5) for _ in range(2)]
        assert [d.body for d in got] == [b"a" * 10, b"b" * 100_000]
        for d in got:
            d.ack(wait=False)  # sent without waiting: their replies are read while idle
        q.put(b"posted", wait=False)
        d = q.get(timeout=5)
        assert d.body == b"posted"
        d.ack()
        b.ping()
    # ssl= takes a context of the caller's, with a tcp:// url as well
    with shmq.connect(f"tcp://127.0.0.1:{srv.port}", ssl=_context(os.environ["SHMQ_TLS_CA"])) as b:
        q = b.queue("jobs")
        assert q.purge() == 0  # every one acked
        q.put(b"via ssl=")
        assert q.get(timeout=5).body == b"via ssl="


def test_threads_sharing_one_tls_connection(tls_server):
    """One thread reads for all while others write: the TLS socket is read and written at once."""
    srv = tls_server()
    with shmq.connect(srv.tls_url) as b:
        q = b.create_queue("shared")
        got = []

        def work(t):
            for i in range(100):
                q.put(b"%d-%d" % (t, i))
                d = q.get(timeout=10)
                got.append(d.body)
                d.ack()

        threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads)
        assert sorted(got) == sorted(b"%d-%d" % (t, i) for t in range(4) for i in range(100))
        assert q.stats().ready == 0


def test_asyncio_client_puts_and_gets_over_tls(tls_server):
    srv = tls_server()

    async def main():
        b = await shmq.aio.connect(srv.tls_url)
        try:
            q = await b.create_queue("jobs")
            await q.put(b"x" * 70_000)
            got = await q.get(timeout=5)
            await got.ack()
            return got.body
        finally:
            await b.close()

    assert asyncio.run(main()) == b"x" * 70_000


def test_a_wrong_ca_is_refused_in_one_line_that_says_how_to_trust_the_right_one(tls_server, monkeypatch, certs):
    """Before: ``certificate verify failed: unable to get local issuer certificate``, and
    not a word of $SHMQ_TLS_CA or ssl=."""
    srv = tls_server()
    monkeypatch.setenv("SHMQ_TLS_CA", certs.other_ca)
    wrong_ca = (_VERIFY_FAILED + r" certificate \(\$SHMQ_TLS_CA " + re.escape(certs.other_ca) + " did not sign"
                + _SET_THE_CA)
    with pytest.raises(BrokerUnavailable, match=wrong_ca):
        shmq.connect(srv.tls_url)
    with pytest.raises(BrokerUnavailable, match=wrong_ca):
        asyncio.run(shmq.aio.connect(srv.tls_url))
    monkeypatch.setenv("SHMQ_TLS_CA", certs.dir + "/missing.pem")
    with pytest.raises(ValueError, match=r"^\$SHMQ_TLS_CA \S+/missing\.pem: no CA certificate \(no such file or "
                                         r"directory\)$"):
        shmq.connect(srv.tls_url)
    monkeypatch.delenv("SHMQ_TLS_CA")  # the system's CAs do not know ours either
    with pytest.raises(BrokerUnavailable, match=_VERIFY_FAILED + r" certificate \(none of the system's CAs signed"
                                                + _SET_THE_CA):
        shmq.connect(srv.tls_url)
    with pytest.raises(BrokerUnavailable, match=_VERIFY_FAILED + r" certificate \(the ssl= context trusts no CA "
                                                r"that signed the server's certificate: give it the CA that did, "
                                                r"ssl\.create_default_context\(cafile=CA\)\)$"):
        shmq.connect(srv.tls_url, ssl=_context(certs.other_ca))
    with shmq.connect(srv.tls_url.replace("127.0.0.1", "localhost"), ssl=_context(certs.ca)) as b:
        b.ping()  # the right CA, by name (the certificate's DNS:localhost)
    assert srv.proc.poll() is None


def test_a_certificate_made_out_to_another_name_says_to_connect_by_its_name(broker, servers, tls_env):
    _signed(tls_env.dir, "elsewhere", "ca", "subjectAltName=DNS:elsewhere.invalid\nextendedKeyUsage=serverAuth\n")
    srv = servers(broker.namespace, "--no-persist", "--tls-cert", os.path.join(tls_env.dir, "elsewhere.pem"),
                  "--tls-key", os.path.join(tls_env.dir, "elsewhere.key"))
    with pytest.raises(BrokerUnavailable, match=r"cannot connect to 127\.0\.0\.1:\d+: TLS certificate verify failed: "
                                                r"IP address mismatch.* \(connect by a name or address the server's "
                                                r"certificate holds: its subjectAltName\)$"):
        shmq.connect(f"tcps://127.0.0.1:{srv.port}")
    assert srv.stop() == 0


@pytest.mark.parametrize("separate", [True, False], ids=["tls-key", "key-in-the-cert-file"])
def test_a_private_key_every_user_can_read_is_a_warning_naming_the_chmod(broker, servers, certs, tmp_path, separate):
    """Before: accepted without a word."""
    key = tmp_path / "server.key"
    if separate:
        key.write_bytes(open(certs.key, "rb").read())
        args, named = ["--tls-cert", certs.cert, "--tls-key", str(key)], f"--tls-key {key}"
    else:  # one file holds both: the key's mode is the certificate file's
        key.write_bytes(open(certs.cert, "rb").read() + open(certs.key, "rb").read())
        args, named = ["--tls-cert", str(key)], f"--tls-cert {key} (it holds the private key)"
    os.chmod(key, 0o644)
    srv = servers(broker.namespace, "--no-persist", *args)
    warned = [line for line in srv.log if " WARNING " in line]
    assert [line.split(" WARNING ", 1)[1] for line in warned] == [
        f"{named} has mode 0644: every user of this host can read the server's private key; run chmod 600 {key}\n"]
    assert srv.stop() == 0
    os.chmod(key, 0o640)  # group-readable: a group of the owner's choosing (Debian's ssl-cert), no warning
    srv = servers(broker.namespace, "--no-persist", *args)
    assert [line for line in srv.log if " WARNING " in line] == []
    assert srv.stop() == 0


def test_plain_tcp_to_a_tls_port_fails_cleanly_and_the_server_serves_on(tls_server, tcp_server):
    srv = tls_server()
    with pytest.raises(BrokerUnavailable, match=rf"^lost the connection to 127\.0\.0\.1:{srv.port}: connection closed by "
                                                r"the server \(at the HELLO: a server with --tls-cert closes plain "
                                                r"connections; use tcps://\)$"):
        shmq.connect(f"tcp://127.0.0.1:{srv.port}", connect_timeout=10, reconnect=False)
    with pytest.raises(BrokerUnavailable, match=r"closes plain connections; use tcps://\)$"):
        asyncio.run(shmq.aio.connect(f"tcp://127.0.0.1:{srv.port}", reconnect=False))
    with shmq.connect(srv.tls_url) as b:  # it still serves
        b.create_queue("after").put(b"ok")
        assert b.queue("after").get(timeout=5).body == b"ok"
    plain = tcp_server.url.replace("tcp://", "tcps://")  # and TLS to a plain port: one line too
    with pytest.raises(BrokerUnavailable, match=r"cannot connect to 127\.0\.0\.1:\d+: TLS wrong version number$"):
        shmq.connect(plain, connect_timeout=10)


def test_mutual_tls_wants_a_client_certificate(tls_server, monkeypatch, certs):
    srv = tls_server("--tls-client-ca", certs.ca)
    assert any("must show a certificate" in line for line in srv.log)
    refused = (rf"^lost the connection to 127\.0\.0\.1:{srv.port}: connection closed by the server \(at the HELLO, "
               r"over TLS: a server with --tls-client-ca closes connections that show no client certificate its CA "
               r"signed; give one: \$SHMQ_TLS_CERT, or ssl=\)$")
    with pytest.raises(BrokerUnavailable, match=refused):
        shmq.connect(srv.tls_url, reconnect=False)
    with pytest.raises(BrokerUnavailable, match=refused):
        asyncio.run(shmq.aio.connect(srv.tls_url))
    with shmq.connect(srv.tls_url, ssl=_context(certs.ca, certs.client_cert, certs.client_key)) as b:
        b.create_queue("m").put(b"1")
    monkeypatch.setenv("SHMQ_TLS_CERT", certs.client_cert)
    monkeypatch.setenv("SHMQ_TLS_KEY", certs.client_key)
    with shmq.connect(srv.tls_url) as b:
        d = b.queue("m").get(timeout=5)
        assert d.body == b"1"
        d.ack()

    async def aio():
        b = await shmq.aio.connect(srv.tls_url)
        try:
            q = await b.queue("m")
            await q.put(b"2")
            return (await q.get(timeout=5)).body
        finally:
            await b.close()

    assert asyncio.run(aio()) == b"2"
    assert srv.proc.poll() is None


def test_fork_and_reconnect_over_tls(tls_server, broker):
    srv = tls_server()
    b = shmq.connect(srv.tls_url)
    try:
        q = b.create_queue("f")
        child = multiprocessing.get_context("fork").Process(target=lambda: q.put(b"forked"))
        child.start()
        child.join(30)
        assert child.exitcode == 0
        d = q.get(timeout=5)  # the parent's connection went on
        assert d.body == b"forked"
        d.ack()
        assert srv.stop() == 0
        tls_server("--port", str(srv.port))  # the same port: the next call connects again, in TLS
        q.put(b"after the restart")
        assert q.get(timeout=5).body == b"after the restart"
    finally:
        b.close()


def test_the_asyncio_client_over_tls_in_a_forked_child(tls_server):
    srv = tls_server()

    async def main():
        b = await shmq.aio.connect(srv.tls_url)
        try:
            q = await b.create_queue("af")

            async def child_puts():  # the inherited handle, in the child's own loop: a handshake of its own
                await (await b.queue("af")).put(b"child")

            child = multiprocessing.get_context("fork").Process(target=lambda: asyncio.run(child_puts()))
            child.start()
            await asyncio.to_thread(child.join, 30)
            assert child.exitcode == 0
            await q.put(b"parent")  # the parent's TLS session went on
            got = [await q.get(timeout=5) for _ in range(2)]
            for d in got:
                await d.ack()
            return sorted(d.body for d in got)
        finally:
            await b.close()

    assert asyncio.run(main()) == [b"child", b"parent"]


def test_a_tls_connection_the_server_closed_while_idle_is_noticed_and_made_again(tls_server):
    srv = tls_server("--idle-timeout", "1")
    with shmq.connect(srv.tls_url, heartbeat=None) as b:  # (heartbeats would keep it from being idle)
        q = b.create_queue("idle")
        q.put(b"1", wait=False)  # its reply is read, without waiting, by the next call
        q.put(b"2")
        # closed within a bound: TLS's close waits tcp.TLS_SHUTDOWN_S for a close_notify, not asyncio's 30 s
        srv.wait_for_line(lambda line: "connection closed" in line and "idle" in line, timeout=15)
        q.put(b"3")  # the close is seen before it is sent: connected again, nothing sent twice
        assert [q.get(timeout=5).body for _ in range(3)] == [b"1", b"2", b"3"]
        assert q.stats().ready == 0


def test_a_bad_certificate_or_key_is_one_line_exit_2(certs, tmp_path):
    def run(*args):
        return subprocess.run([sys.executable, "-m", "shmq.cli", "server", "--namespace", "t" + uuid.uuid4().hex[:12],
                               "--no-persist", "--port", "0", *args], capture_output=True, text=True, timeout=60,
                              stdin=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": os.getcwd()})

    r = run("--tls-cert", str(tmp_path / "missing.pem"))
    assert r.returncode == 2
    assert re.fullmatch(rf"shmq: error: --tls-cert {tmp_path / 'missing.pem'}: not a certificate and its key: no "
                        r"such file or directory; try '.*server --help'\n", r.stderr)
    r = run("--tls-cert", certs.cert, "--tls-key", certs.client_key)  # not its key
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "not a certificate and its key: key values mismatch" in r.stderr
    r = run("--tls-cert", certs.cert, "--tls-key", certs.key, "--tls-client-ca", certs.key)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert f"--tls-client-ca {certs.key}: no CA certificate" in r.stderr
    _openssl("ec", "-in", certs.key, "-aes256", "-passout", "pass:secret", "-out", str(tmp_path / "enc.key"),
             cwd=str(tmp_path))
    r = run("--tls-cert", certs.cert, "--tls-key", str(tmp_path / "enc.key"))  # it never prompts for a password
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "not a certificate and its key: not PEM, or an encrypted key (give it unencrypted, 0600)" in r.stderr
    r = run("--tls-key", certs.key)
    assert r.returncode == 2 and "--tls-key and --tls-client-ca need --tls-cert" in r.stderr


def _cli(*args, env=None):
    return shmq_cli(*args, env=env)


def test_the_cli_with_a_tcps_url(tls_server, certs):
    srv = tls_server()
    assert _cli("create", "c", "--url", srv.tls_url).returncode == 0
    r = _cli("produce", "c", "-m", "hello", "--url", srv.tls_url)
    assert r.returncode == 0, r.stderr
    r = _cli("consume", "c", "--url", srv.tls_url)
    assert (r.returncode, r.stdout.strip()) == (0, "hello"), r.stderr
    r = _cli("list", "--url", srv.tls_url, env={"SHMQ_TLS_CA": certs.other_ca})
    assert r.returncode == 1
    assert re.fullmatch(r"shmq: error: " + _VERIFY_FAILED + r" certificate \(\$SHMQ_TLS_CA " + re.escape(certs.other_ca)
                        + " did not sign" + _SET_THE_CA[:-1] + r"\n", r.stderr)


def test_kafka_clients_over_sasl_ssl_and_ssl(broker, servers, tls_env, tmp_path):
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    token_file = tmp_path / "token"
    token_file.write_text("s3cret-token\n")
    token_file.chmod(0o600)
    srv = servers(broker.namespace, "--no-persist", "--kafka-port", "0", "--token-file", str(token_file),
                  "--tls-cert", tls_env.cert, "--tls-key", tls_env.key)
    bootstrap = "127.0.0.1:%s" % re.search(r"kafka listener on \S+:(\d+)", "".join(srv.log)).group(1)
    conf = {"bootstrap_servers": bootstrap, "security_protocol": "SASL_SSL", "ssl_cafile": tls_env.ca,
            "sasl_mechanism": "PLAIN", "sasl_plain_username": "anyone", "sasl_plain_password": "s3cret-token"}
    try:
        p = KafkaProducer(**conf)
        metas = [p.send("tls", value=b"v%d" % i, partition=0).get(timeout=30) for i in range(5)]
        p.close()
        assert [m.offset for m in metas] == list(range(5))
        c = KafkaConsumer(enable_auto_commit=False, consumer_timeout_ms=15000, **conf)
        try:
            c.assign([TopicPartition("tls", 0)])
            c.seek(TopicPartition("tls", 0), 0)
            got = [m.value for _, m in zip(range(5), c)]
        finally:
            c.close()
        assert got == [b"v%d" % i for i in range(5)]
        assert [r.value for r in broker.stream("tls").read(0, 0, 10)] == got  # the same records, natively
    finally:
        assert srv.stop() == 0
    # no token: Kafka's SSL, here with confluent-kafka (librdkafka)
    from confluent_kafka import Producer

    srv = servers(broker.namespace, "--no-persist", "--no-auth", "--kafka-port", "0",
                  "--tls-cert", tls_env.cert, "--tls-key", tls_env.key)
    bootstrap = "127.0.0.1:%s" % re.search(r"kafka listener on \S+:(\d+)", "".join(srv.log)).group(1)
    try:
        p = Producer({"bootstrap.servers": bootstrap, "security.protocol": "SSL", "ssl.ca.location": tls_env.ca})
        for i in range(3):
            p.produce("tls", value=b"ssl%d" % i, partition=0)
        assert p.flush(30) == 0
        assert [r.value for r in broker.stream("tls").read(0, 5, 10)] == [b"ssl0", b"ssl1", b"ssl2"]
    finally:
        assert srv.stop() == 0


def _kombu_round_trip(url, **kw):
    from kombu import Connection

    with Connection(url, **kw) as c:
        with c.SimpleQueue("k") as q:
            q.put({"url": url})
            m = q.get(timeout=10)
            assert m.payload == {"url": url}
            m.ack()


def test_kombu_urls_over_tls(tls_server, certs, monkeypatch):
    from kombu import Connection

    import shmq.kombu  # noqa: F401 - registers shmq:// and shmqs://

    srv = tls_server()
    for url in (f"shmqs://127.0.0.1:{srv.port}", f"shmq://127.0.0.1:{srv.port}?ssl=true"):  # $SHMQ_TLS_CA
        _kombu_round_trip(url)
    monkeypatch.delenv("SHMQ_TLS_CA")
    with pytest.raises(BrokerUnavailable, match=_VERIFY_FAILED):
        Connection(f"shmqs://127.0.0.1:{srv.port}").connect()
    _kombu_round_trip(f"shmq://127.0.0.1:{srv.port}?ssl_ca_certs={certs.ca}")  # the CA named in the url
    _kombu_round_trip(f"shmq://127.0.0.1:{srv.port}", ssl={"ca_certs": certs.ca})  # Celery's broker_use_ssl
    _kombu_round_trip(f"shmq://127.0.0.1:{srv.port}", ssl=_context(certs.ca))
    with pytest.raises(BrokerUnavailable, match=r"closes plain connections; use tcps://\)$"):
        Connection(f"shmq://127.0.0.1:{srv.port}?ssl=false").connect()  # plain TCP to a TLS port


def test_dramatiq_url_over_tls(tls_server):
    import dramatiq

    from shmq.dramatiq import ShmqBroker

    srv = tls_server()
    b = ShmqBroker(url=srv.tls_url)
    try:
        b.declare_queue("d")
        b.enqueue(dramatiq.Message(queue_name="d", actor_name="work", args=("over tls",), kwargs={}, options={}))
        c = b.consume("d", timeout=5000)
        try:
            m = next(c)
            assert list(m.args) == ["over tls"]
            c.ack(m)
        finally:
            c.close()
    finally:
        b.close()


def test_the_spark_url_option_takes_tcps(tls_server):
    from shmq.spark.options import Options, SpecError

    srv = tls_server()
    opts = Options({"queue": "spark", "url": srv.tls_url})  # what a source or sink gives each task
    with opts.connect() as b:
        b.create_queue("spark").put(b"row")
        assert b.queue("spark").get(timeout=5).body == b"row"
    with pytest.raises(SpecError, match=r"^option url must be tcp://host:port \(tcps:// for TLS\), not 'http://h:1'$"):
        Options({"queue": "spark", "url": "http://h:1"})
