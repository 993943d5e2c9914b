"""bench/docs.py: docs/PERFORMANCE.md and README.md's figures are the saved runs' (one owner
per figure), each block opens with its run (date and commit), a page whose blocks disagree
with their JSON is found stale, and a run the suite no longer takes (unstamped, another
layout, more than 14 days old) fails it; a run whose code moved since is named by --check."""

import ast
import datetime
import json
import shutil
from pathlib import Path

import pytest

from bench import docs, provenance, scaling

ROOT = Path(__file__).resolve().parent.parent


def test_the_pages_match_their_saved_runs():
    stale = docs.stale()
    assert stale == [], (f"{[page for page, _ in stale]} differ from the saved runs under docs/: "
                         "run python -m bench.docs")


def _copy(tmp_path):
    """The pages and the saved runs they embed, in a root of the test's own."""
    (tmp_path / "docs").mkdir()
    for page in docs.pages():
        shutil.copy(ROOT / page, tmp_path / page)
    for run in (ROOT / "docs").glob("*.json"):
        shutil.copy(run, tmp_path / "docs" / run.name)
    return tmp_path


def test_a_figure_changed_in_a_saved_run_makes_every_page_that_shows_it_stale(tmp_path):
    root = _copy(tmp_path)
    path = root / "docs" / "bench.json"
    doc = json.loads(path.read_text())
    doc["durability"][0]["msgs_per_s"] = 123_456.0  # memory mode, shown in both pages
    path.write_text(json.dumps(doc))
    stale = dict(docs.stale(root=root))
    assert sorted(stale) == ["docs/OPERATIONS.md", "docs/PERFORMANCE.md"]
    snapshot = doc["durability"][1]["msgs_per_s"]
    for page, text in stale.items():
        assert "| memory | 123 k | 1.00x |" in text
        assert f"| snapshot | {scaling.si(snapshot)} | {snapshot / 123_456:.2f}x |" in text  # the ratio follows
        (root / page).write_text(text)
    assert docs.stale(root=root) == []  # rewritten, they match


def test_a_block_opens_with_its_runs_date_command_and_machine(tmp_path):
    root = _copy(tmp_path)
    page = root / "page.md"
    page.write_text("prose\n<!-- bench:begin durability docs/bench.json -->\nold\n<!-- bench:end -->\nmore prose\n")
    (_, text), = docs.stale(["page.md"], root=root)
    lines = text.splitlines()
    assert lines[0] == "prose" and lines[-1] == "more prose"
    doc = json.loads((root / "docs" / "bench.json").read_text())
    assert lines[2].startswith(f"*{doc['date'][:10]}, commit {doc['code']['commit'][:7]}, `{doc['command']}`: "
                               f"{doc['machine']['cpu']}, ")
    assert "each figure the median of 3 runs" in lines[2] and "[`docs/bench.json`](docs/bench.json)" in lines[2]
    assert "Versions: shmq 0.1.0 (C hot paths), faster-fifo 1.5.2," in lines[2]


def test_a_run_that_measured_the_machines_python_speed_says_it_and_an_older_one_does_not(tmp_path):
    root = _copy(tmp_path)
    page = root / "page.md"
    page.write_text("<!-- bench:begin durability docs/bench.json -->\n<!-- bench:end -->\n")
    doc_path = root / "docs" / "bench.json"
    doc = json.loads(doc_path.read_text())
    doc["machine"].pop("python_speed_us", None)
    doc_path.write_text(json.dumps(doc))
    (_, before), = docs.stale(["page.md"], root=root)
    assert "Python loop" not in before
    doc["machine"]["python_speed_us"] = [160.4, 221.6]
    doc_path.write_text(json.dumps(doc))
    (_, after), = docs.stale(["page.md"], root=root)
    assert "; a Python loop of 2,000 additions 160 µs at best, 222 at the median. Versions: " in after.splitlines()[1]


def test_a_run_not_saved_yet_says_so(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("<!-- bench:begin scale docs/none.json -->\n<!-- bench:end -->\n")
    (_, text), = docs.stale(["page.md"], root=tmp_path)
    assert text == "<!-- bench:begin scale docs/none.json -->\n*No saved run yet (`docs/none.json`).*\n" \
                   "<!-- bench:end -->\n"


@pytest.mark.parametrize("text, error", [
    ("<!-- bench:begin scale docs/x.json -->\n", "markers do not pair up"),
    ("<!-- bench:end -->\n<!-- bench:begin scale docs/x.json -->\n", "markers do not pair up"),
    ("<!-- bench:begin scale -->\n<!-- bench:end -->\n", "must read <!-- bench:begin KIND FILE -->"),
    ("<!-- bench:begin charts docs/x.json -->\n<!-- bench:end -->\n", "unknown view 'charts'"),
])
def test_malformed_markers_are_refused_in_one_line(tmp_path, text, error, capsys):
    page = tmp_path / "page.md"
    page.write_text(text)
    with pytest.raises(docs.BlockError, match=error.replace("(", r"\(")):
        docs.stale(["page.md"], root=tmp_path)
    assert docs.main(["--check", str(page)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bench.docs: error: ") and err.count("\n") == 1


def _case(system, pairs, shape, rate, mode="msg"):
    return {"system": system, "kind": "tput", "size": 64, "mode": mode, "n": 1000, "pairs": pairs, "shape": shape,
            "status": "ok", "detail": "", "runs": [{"seconds": 1000 / rate}], "seconds": 1.0,
            "summary": {"msgs_per_s": rate}}


def test_a_scale_run_renders_a_table_per_shape_with_ratios_to_1_to_1():
    machine = {"cpu": "Xeon", "logical_cpus": 16, "usable_cpus": 16, "os": "Linux", "python": "3.12.3",
               "shmq": "0.1.0 (C hot paths)", "pyzmq": "27.3.0", "redis-py": "8.1.0"}
    doc = {"date": "2026-11-24T10:00:00+00:00", "command": "python -m bench.scale --pairs 1,2", "machine": machine,
           "settings": {"runs": 3}, "skipped": {"faster-fifo": "faster-fifo not installed"},
           "cases": [_case("shmq", 1, "P->P", 200_000), _case("zmq", 1, "P->P", 600_000),
                     _case("shmq", 2, "P->P", 300_000), _case("zmq", 2, "P->P", 300_000),
                     _case("shmq", 2, "P->1", 250_000)]}
    lines = docs.scale(doc, "docs/scale.json", "scale.json")
    assert lines[0] == ("*2026-11-24, `python -m bench.scale --pairs 1,2`: Xeon, 16 logical CPUs, Linux, "
                        "Python 3.12.3; each figure the median of 3 runs. Versions: shmq 0.1.0 (C hot paths), "
                        "pyzmq 27.3.0. Raw runs: [`docs/scale.json`](scale.json).*")
    assert lines[2:8] == ["| 64 B, P producers -> P consumers, per message | acks | 1->1 | 2->2 |",
                          "|---|---|---:|---:|",
                          "| shmq | each | 200 k | 300 k (1.50x) |",
                          "| zmq | none | 600 k | 300 k (0.50x) |",
                          "| **shmq / best peer** |  | 0.33x | 1.00x |", ""]
    assert lines[8:13] == ["| 64 B, P producers -> 1 consumer, per message | acks | 1->1 | 2->1 |",
                           "|---|---|---:|---:|", "| shmq | each | 200 k | 250 k (1.25x) |",
                           "| zmq | none | 600 k | not run |", "| **shmq / best peer** |  | 0.33x |  |"]
    assert lines[-1] == "- not measured: faster-fifo not installed"
    summary = docs.scale_summary(doc, "docs/scale.json", "scale.json")
    assert "P producers -> 1 consumer" not in "\n".join(summary) and summary[4] == lines[4]


def test_the_spark_view_reads_the_spark_runs_fields():
    doc = json.loads((ROOT / "docs" / "spark-bench.json").read_text())
    lines = docs.spark(doc, "docs/spark-bench.json", "spark-bench.json")
    assert lines[2:4] == ["| source → sink | batches | overall rows/s | steady rows/s |", "|---|---:|---:|---:|"]
    assert len([ln for ln in lines if ln.startswith("| ") and "→" in ln]) == len(doc["cases"]) + 1
    assert "pyspark " in lines[0] and f"`{doc['command']}`" in lines[0] and lines[0].startswith(f"*{doc['date'][:10]}")


def test_a_tcp_run_renders_shmq_over_redis_with_the_issues_targets():
    machine = {"cpu": "AMD EPYC", "logical_cpus": 2, "usable_cpus": 2, "os": "Linux", "python": "3.11.7",
               "shmq": "0.1.0 (C hot paths)", "redis-py": "8.1.0", "redis-server": "7.0.15"}

    def case(system, kind, mode, shape, summary):
        return {"system": system, "kind": kind, "size": 64, "mode": mode, "n": 1000, "pairs": 1, "shape": shape,
                "status": "ok", "detail": "", "runs": [{}], "seconds": 1.0, "summary": summary}

    rtt = {"p50_min_us": 0.0, "p50_max_us": 0.0, "p99_us": 500.0, "p999_us": 900.0}
    doc = {"date": "2026-11-24T10:00:00+00:00", "command": "python -m bench.tcp --cases pingpong,pipe",
           "machine": machine, "settings": {"runs": 3}, "skipped": {},
           "cases": [case("shmq-tcp", "rtt", "msg", "P->P", dict(rtt, p50_us=90.0)),
                     case("redis", "rtt", "msg", "P->P", dict(rtt, p50_us=200.0)),
                     case("shmq-tcp", "tput", "pipe", "P->0", {"msgs_per_s": 150_000.0}),
                     case("redis", "tput", "pipe", "P->0", {"msgs_per_s": 100_000.0})]}
    lines = docs.tcp(doc, "docs/tcp.json", "tcp.json")
    assert lines[0].startswith("*2026-11-24, `python -m bench.tcp --cases pingpong,pipe`: AMD EPYC, 2 logical CPUs")
    assert "Versions: shmq 0.1.0 (C hot paths), redis-py 8.1.0, redis-server 7.0.15." in lines[0]
    assert lines[2:8] == [
        "| case | size | P->C | figure | shmq-tcp | redis | shmq / redis | target (issue 44) |",
        "|---|---|---|---|---:|---:|---:|---|",
        "| ping-pong | 64 B | 1->1 | p50 µs | 90.0 | 200.0 | 0.45x | <= 0.8x: **met** |",
        "| ping-pong | 64 B | 1->1 | p99 µs | 500.0 | 500.0 | 1.00x |  |",
        "| ping-pong | 64 B | 1->1 | p99.9 µs | 900.0 | 900.0 | 1.00x |  |",
        "| pipelined put | 64 B | 1->0 | msgs/s | 150 k | 100 k | 1.50x | >= 3.0x: **missed** |"]
    assert lines[9] == "Targets of issue 44 (64 B): 1 of 2 met; not met: pipelined put 1->0 msgs/s."
    assert lines[11].startswith("- shmq / redis: shmq's median over Redis's in the same run; for a latency")
    assert docs.KINDS["tcp"] is docs.tcp


def test_every_table_is_a_stamped_run_of_the_current_layouts_at_most_14_days_old():
    """Each block's run keeps its date, commit and code stamp (bench/provenance.py); one
    unstamped, of another layout, or older than 14 days fails here: run its command again.
    Code that moved since its run does not (``bench.docs --check`` names it)."""
    old = docs.expired()
    assert old == [], "\n".join(old)


def test_a_run_too_old_of_another_layout_or_unstamped_is_expired_and_code_that_moved_is_not(tmp_path):
    root = _copy(tmp_path)
    path = root / "docs" / "tcp.json"
    doc = json.loads(path.read_text())
    ran = datetime.date.fromisoformat(doc["date"][:10])

    def tcp(today):
        return [x for x in docs.expired(["docs/PERFORMANCE.md"], root=root, today=today) if " docs/tcp.json " in x]

    assert tcp(ran + datetime.timedelta(days=14)) == []
    assert [x.rsplit(": ", 1)[1] for x in tcp(ran + datetime.timedelta(days=15))] == ["15 days old (at most 14)"]
    doc["code"]["files"]["shmq/engine/queues/consume.py"] = "0" * 16  # code moved since: not expired
    path.write_text(json.dumps(doc))
    assert tcp(ran) == []
    assert any(line.startswith("docs/PERFORMANCE.md: tcp docs/tcp.json") for line in docs.outdated(root=root))
    doc["code"]["layouts"]["queue"] -= 1
    path.write_text(json.dumps(doc))
    [line] = tcp(ran)
    assert line.endswith(f"queue layout {doc['code']['layouts']['queue']} -> {doc['code']['layouts']['queue'] + 1}")
    del doc["code"]
    path.write_text(json.dumps(doc))
    [line] = tcp(ran)
    assert "no code stamp" in line


def test_a_new_stamp_names_its_commit():
    code = provenance.stamp("arrays")
    assert code["commit"] is not None and len(code["commit"].rstrip("+")) == 12


def test_the_tcp_runs_measure_every_module_of_the_server_and_the_kafka_run_its_listener():
    """A module of the server in a folder (handlers/) is in the stamps of every run over
    TCP, as one beside tcp.py is, so a change to it ages those runs; the Kafka listener's
    folder is in the Kafka run's. (The coordinator's, transactions/, serves no bench's path.)"""
    server = ROOT / "shmq" / "server"
    every = {p.relative_to(ROOT).as_posix() for p in server.rglob("*.py")
             if not {"kafka", "transactions"} & set(p.relative_to(server).parts[:-1])}
    assert "shmq/server/handlers/queues.py" in every and "shmq/server/connection.py" in every
    for what in ("tcp", "matrix", "jobs", "kafka", "streams"):
        assert every <= set(provenance.files(what)), (what, sorted(every - set(provenance.files(what))))
    listener = {p.relative_to(ROOT).as_posix() for p in (server / "kafka").glob("*.py")}
    assert listener and listener <= set(provenance.files("kafka"))


def test_a_run_older_than_its_code_is_found(tmp_path):
    root = _copy(tmp_path)
    for run in (root / "docs").glob("*.json"):  # every run as if made on the tree now
        d = json.loads(run.read_text())
        if d.get("code"):
            d["code"] = provenance.stamp(d["code"]["measures"])
            run.write_text(json.dumps(d))
    path = root / "docs" / "tcp.json"
    doc = json.loads(path.read_text())
    edited = "shmq/engine/queues/consume.py"
    doc["code"]["files"][edited] = "0" * 16  # as if the run had measured another consume.py
    path.write_text(json.dumps(doc))
    old = docs.outdated(["docs/PERFORMANCE.md"], root=root)
    assert len(old) == 1 and old[0].startswith("docs/PERFORMANCE.md: tcp docs/tcp.json (run of ")
    assert old[0].endswith(f"is older than the code it measures: {edited}")
    del doc["code"]
    path.write_text(json.dumps(doc))
    assert "no code stamp" in docs.outdated(["docs/PERFORMANCE.md"], root=root)[0]
    doc["code"] = provenance.stamp("tcp")
    doc["code"]["layouts"]["queue"] -= 1
    path.write_text(json.dumps(doc))
    assert docs.outdated(["docs/PERFORMANCE.md"], root=root)[0].endswith(
        f"measures: queue layout {doc['code']['layouts']['queue']} -> {doc['code']['layouts']['queue'] + 1}")


def test_a_stamp_follows_code_not_comments_or_docstrings(tmp_path, monkeypatch):
    monkeypatch.setitem(provenance.MEASURES, "toy", ["src/*.py", "src/*.c"])
    src = tmp_path / "src"
    src.mkdir()
    py, c = src / "hot.py", src / "hot.c"
    py.write_text('"""The hot path."""\n\ndef put(x):\n    """Put x."""\n    return x + 1  # one\n')
    c.write_text("/* the C path */\nint put(int x) { return x + 1; } // one\n")
    code = provenance.stamp("toy", root=str(tmp_path))
    assert sorted(code["files"]) == ["src/hot.c", "src/hot.py"]
    py.write_text('"""The hot path, said again."""\n\n\ndef put(x):\n    # a comment\n    return x + 1\n')
    c.write_text("/* the C path,\n   said again */\nint put(int x)\n{\n    return x + 1;\n}\n")
    assert provenance.changed(code, root=str(tmp_path)) == []  # the same code
    py.write_text('"""The hot path."""\n\ndef put(x):\n    return x + 2\n')
    c.write_text("int put(int x) { return x + 2; }\n")
    (src / "new.py").write_text("X = 1\n")
    assert provenance.changed(code, root=str(tmp_path)) == ["src/new.py (new)", "src/hot.c", "src/hot.py"]
    with pytest.raises(KeyError, match="unknown run 'nothing'"):
        provenance.stamp("nothing")
    tree = provenance._canonical(ast.parse("def put(x):\n    return x\n"))
    assert "decorator_list" not in tree and "type_params" not in tree and "returns" not in tree  # empty: left out
    assert tree.startswith("Module(body=[FunctionDef(name='put', args=arguments(args=[arg(arg='x')])")


@pytest.mark.parametrize("kind, head", [
    ("jobs", "| tool | mode | shmq (local) | shmq (TCP) | Redis | shmq local / Redis | target (issue 29) |"),
    ("kafka", "| system | records/s | p50 produce-to-consume | Kafka path / system | target (issue 44) |"),
    ("memory", "| one queue or partition | empty | holding 10,000 x 1,024 B | after they are consumed |"),
    ("compaction", "| appends to one partition | records a call | records/s | vs not compacted | call p50 µs | call p99 µs "
                   "| longest call ms | runs | MiB taken back |"),
])
def test_the_jobs_kafka_and_memory_views_render_their_saved_runs(kind, head):
    path = ROOT / "docs" / f"{kind}.json"
    doc = json.loads(path.read_text())
    lines = docs.KINDS[kind](doc, f"docs/{kind}.json", f"{kind}.json")
    assert lines[0].startswith(f"*{doc['date'][:10]}, commit {doc['code']['commit'][:7]}, `{doc['command']}`: ")
    assert lines[2] == head
    assert len([ln for ln in lines if ln.startswith("| ")]) == len(doc["rows"]) + 1 or kind == "jobs"
