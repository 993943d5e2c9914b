"""No false success: a snapshot that cannot be written is never said written. A running
server shows it (an ERROR line when it starts, `shmq doctor`'s warning and exit 1, the
metric in tests/test_metrics.py); a stop whose last snapshot failed says so at ERROR and
exits 1; one whose last snapshot was written exits 0."""

import json
import os
import time

from tests.test_cli import shmq_cli


def test_a_stop_that_could_not_save_what_it_holds_exits_1_and_doctor_warned(broker, servers, tmp_path):
    data = tmp_path / "data"
    srv = servers(broker.namespace, "--data-dir", str(data), "--snapshot-interval", "0.05")
    broker.create_queue("good").put(b"kept")
    (data / "bad.dmsq.tmp").mkdir()  # every snapshot of queue "bad" fails (as on a full disk)
    broker.create_queue("bad").put_many([b"x"] * 100)
    srv.wait_for_line(lambda line: "cannot write the snapshot of queue bad" in line)
    report = {}

    def warned():
        report.update(json.loads(shmq_cli("doctor", "--namespace", broker.namespace, "--json").stdout))
        return report["problems"]

    deadline = time.monotonic() + 10
    while not warned():
        assert time.monotonic() < deadline, report
        time.sleep(0.05)
    assert "cannot snapshot to" in report["problems"][0] and "queue bad" in report["problems"][0]
    r = shmq_cli("doctor", "--namespace", broker.namespace)
    assert r.returncode == 1 and "warning: it cannot snapshot to" in r.stdout
    assert srv.stop() == 1
    tail = "".join(srv.later)
    assert "stopped without a complete last snapshot" in tail and " ERROR " in tail
    assert not any("INFO snapshot of" in line and "written" in line for line in srv.later[-5:])
    os.rmdir(data / "bad.dmsq.tmp")


def test_a_stop_that_saved_everything_exits_0(broker, servers, tmp_path):
    srv = servers(broker.namespace, "--data-dir", str(tmp_path))
    broker.create_queue("good").put(b"kept")
    assert srv.stop() == 0
    assert "stopped namespace=" in "".join(srv.later) and (tmp_path / "good.dmsq").exists()
