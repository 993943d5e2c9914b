"""The pages' figures, from saved runs: ``python -m bench.docs`` (``--check``: change nothing, exit 1 if stale).

Strategy: one owner per figure. The bench writes a run's JSON; a page (README.md or
docs/*.md: docs/PERFORMANCE.md) keeps prose of its own and embeds figures only in
generated blocks::

    <!-- bench:begin KIND FILE -->
    (generated from FILE, a path from the repository's root)
    <!-- bench:end -->

This module rewrites every block from its file; KIND names the view (``KINDS``). Each
block opens with its run's date, command and machine, and compares only figures of that
run. The test suite runs ``check`` against the saved runs, so a page that disagrees with
its JSON fails it, and so does a page that shows a run older than the code it measured
(``outdated``: each run's JSON keeps its code stamp, ``bench/provenance.py``). The Spark
run's fields are read in one place (``spark``). A block's first line names its run's date
and commit; ``expired`` lists the runs the test suite no longer takes (no stamp, another
layout, more than ``provenance.MAX_AGE_DAYS`` old), ``outdated`` (``--check``) the runs whose
measured code moved since, for whoever is about to publish figures.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys

from bench import provenance, report, scaling, tcp_report
from bench.adapters import REGISTRY, STREAM_REGISTRY, acks
from bench.harness import CaseResult
from bench.machine import SYSTEM_VERSIONS, VERSIONED, speed_text
from bench.plan import size_label

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BLOCK = re.compile(r"^<!-- bench:begin (?P<kind>[\w-]+) (?P<file>\S+) -->\n(?P<body>.*?)^<!-- bench:end -->$",
                   re.M | re.S)
MARK = re.compile(r"^<!-- bench:(begin|end)\b.*$", re.M)


class BlockError(ValueError):
    """A page's markers are malformed, or name a view that does not exist."""


# ---------------------------------------------------------------- what every block opens with


def run_line(doc, path, link, runs=None, extra_versions=()):
    """The run a block shows: date, the commit it ran on, command, machine, the versions of
    shmq and of the systems it ran (and ``extra_versions``' keys), load, and a link to its JSON."""
    m = doc["machine"]
    date = (doc.get("date") or "")[:10] or "date not recorded"
    ran_on = (doc.get("code") or {}).get("commit")
    if ran_on:
        date += f", commit {ran_on[:7]}{'+' if ran_on.endswith('+') else ''}"
    command = doc.get("command") or "command not recorded"
    cpus = f"{m['logical_cpus']} logical CPUs"
    if m.get("usable_cpus") not in (None, m["logical_cpus"]):
        cpus += f" ({m['usable_cpus']} usable)"
    systems = {c.get("system") for c in doc.get("cases", []) + (doc.get("streams") or {}).get("cases", [])}
    keys = ["shmq", *(k for k in VERSIONED if any(k in SYSTEM_VERSIONS.get(s, ()) for s in systems)), *extra_versions]
    versions = ", ".join(f"{k} {m[k]}" for k in keys if m.get(k))
    load = f"; 1-minute load {m['load'][0]:.1f} before, {m['load'][1]:.1f} after" if m.get("load") else ""
    median = f"; each figure the median of {runs} runs" if runs else ""
    if m.get("python_speed_us"):
        median += f"; {speed_text(m['python_speed_us'])}"
    return (f"*{date}, `{command}`: {m['cpu']}, {cpus}, {m['os']}, Python {m['python']}{load}{median}. "
            f"Versions: {versions}. Raw runs: [`{path}`]({link}).*")


def _table(head, rows, align=None):
    """A Markdown table; ``align``: a string of l/r per column (default: first left, rest right)."""
    align = align or "l" + "r" * (len(head) - 1)
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return out


def _grid(grid, acks_column=True):
    head = [grid.title] + (["acks"] if acks_column else []) + grid.columns
    rows = [[f"**{name}**" if name == scaling.LEAD_ROW else name] + ([ack] if acks_column else [])
            + [c.text() for c in cells] for name, ack, cells in grid.rows]
    return _table(head, rows, "l" + ("l" if acks_column else "") + "r" * len(grid.columns))


def _results(doc):
    fields = set(CaseResult.__dataclass_fields__)
    return [(CaseResult(**{k: v for k, v in c.items() if k in fields}), c.get("summary", {})) for c in doc["cases"]]


def _skips(results):
    """One line per distinct reason a case was skipped."""
    seen = {}
    for r, _ in results:
        if r.status == "skipped":
            seen.setdefault((r.system, r.detail), []).append(size_label(r.size))
    return [f"- {system}, {', '.join(dict.fromkeys(sizes))}: skipped ({why})" for (system, why), sizes in seen.items()]


# ---------------------------------------------------------------- the views


def scale(doc, path, link, only=None):
    """python -m bench.scale: a table per shape and mode (``only``: the grids whose title holds it)."""
    results = _results(doc)
    grids = [g for g in scaling.scale_grids(results) if only is None or only in g.title]
    lines = [run_line(doc, path, link, doc["settings"]["runs"]), ""]
    for grid in grids:
        lines += _grid(grid) + [""]
    lines.append("Aggregate msgs/s; (x) = over the system's own 1 -> 1; shmq / best peer: over the fastest system "
                 "that is not shmq's own, same column. acks: what a consumer acknowledges (none: a received message "
                 "is gone).")
    lines += [""] + _skip_systems(doc)
    return lines


def scale_summary(doc, path, link):
    """The P -> P, per message table of a scale run: the figure a front page keeps."""
    return scale(doc, path, link, only="P producers -> P consumers, per message")


def contention(doc, path, link):
    """python -m bench.contention: one table, an operation per row, N per column."""
    results = _results(doc)
    grid = scaling.contention_grid(results)
    seconds = doc["contention"]["seconds"]
    lines = [run_line(doc, path, link, doc["settings"]["runs"]), ""] + _grid(grid, acks_column=False) + [""]
    lines.append(f"Aggregate msgs/s of N processes that only put (the queue starts empty) or only take (it starts "
                 f"full), each for {seconds:g} s after a common start; (x) = over N = 1.")
    if any(c.short for _, _, cells in grid.rows for c in cells):
        lines.append("\\* a run ran out of messages before its time: a shorter run, at that rate.")
    return lines + [""] + _skip_systems(doc)


def _skip_systems(doc):
    return [f"- not measured: {why}" for why in doc.get("skipped", {}).values()]


def matrix(doc, path, link):
    """python -m bench: throughput by message size, a table per topology and mode, with shmq / best peer."""
    results = [(r, s) for r, s in _results(doc) if r.kind == "tput"]
    rel = report.relative(results)
    lines = [run_line(doc, path, link, doc["settings"]["runs"]), ""]
    sizes = sorted({r.size for r, _ in results})
    for flow, mode in dict.fromkeys((report.flow(r), r.mode) for r, _ in results):
        cases = [(r, s) for r, s in results if (report.flow(r), r.mode) == (flow, mode)]
        title = f"msgs/s, {flow.replace('->', ' -> ')}, {scaling.MODE_TEXT[mode]}"
        rows = []
        for system in dict.fromkeys(r.system for r, _ in cases):
            by_size = {r.size: (r, s) for r, s in cases if r.system == system}
            rows.append([system, acks(system)] + [_figure(by_size.get(size)) for size in sizes])
        mine = {r.size: rel[id(r)][1] for r, _ in cases if r.system == "shmq"}
        rows.append(["**shmq / best peer**", ""] + [mine.get(size, "") for size in sizes])
        lines += _table([title, "acks"] + [size_label(x) for x in sizes], rows, "ll" + "r" * len(sizes)) + [""]
    lines.append("best peer: the fastest system that is not shmq's own in the same case. "
                 "Batched, per system: " + "; ".join(f"{s}: {REGISTRY[s].batch_note}"
                                                    for s in dict.fromkeys(r.system for r, _ in results)) + ".")
    return lines + [""] + _skips(results)


def _figure(found):
    if found is None:
        return ""
    r, s = found
    return scaling.si(s["msgs_per_s"]) if r.status == "ok" and s.get("msgs_per_s") else r.status


def rtt(doc, path, link):
    """python -m bench: 64 B ping-pong round trips, microseconds, with the best peer's p50 over each system's."""
    results = [(r, s) for r, s in _results(doc) if r.kind == "rtt"]
    rel = report.relative(results)
    rows = [[r.system, f"{s['p50_us']:.1f}", f"{s['p99_us']:.1f}", f"{s['p999_us']:.1f}", rel[id(r)][1]]
            if r.status == "ok" else [r.system, r.status, "", "", ""] for r, s in results]
    return ([run_line(doc, path, link, doc["settings"]["runs"]), ""]
            + _table(["64 B round trip, µs", "p50", "p99", "p99.9", "best peer p50 / this p50"], rows) + [""])


def durability(doc, path, link):
    """python -m bench: shmq's durability modes, 64 B, 1 -> 1, local attach."""
    rows = doc.get("durability") or []
    base = rows[0].get("msgs_per_s") if rows else None
    body = [[d["mode"], "error", "", "", ""] if "error" in d else
            [d["mode"], scaling.si(d["msgs_per_s"]), f"{d['msgs_per_s'] / base:.2f}x" if base else "",
             f"{d['rtt_p50_us']:.1f}", f"{d['rtt_p99_us']:.1f}"] for d in rows]
    return ([run_line(doc, path, link, doc["settings"]["runs"]), ""]
            + _table(["durability mode", "msgs/s", "vs memory", "RTT p50 µs", "RTT p99 µs"], body) + [""])


def streams(doc, path, link):
    """python -m bench.streams: records/s end to end, a table per P -> 1 and read, with shmq-stream / best peer."""
    skipped, results, _notes = report.read_stream_doc(doc["streams"])
    rel = report.relative(results, own=report.OWN_STREAMS)
    cols = list(dict.fromkeys((r.size, r.mode) for r, _ in results))
    lines = [run_line(doc, path, link, doc["settings"]["runs"]), ""]
    for pairs, read in dict.fromkeys((r.pairs, r.kind) for r, _ in results):
        cases = [(r, s) for r, s in results if (r.pairs, r.kind) == (pairs, read)]
        rows = []
        for system in dict.fromkeys(r.system for r, _ in cases):
            by = {(r.size, r.mode): (r, s) for r, s in cases if r.system == system}
            rows.append([system] + [_figure(by.get(c)) for c in cols])
        mine = {(r.size, r.mode): rel[id(r)][1] for r, _ in cases if r.system == "shmq-stream"}
        rows.append(["**shmq-stream / best peer**"] + [mine.get(c, "") for c in cols])
        read_text = "through a consumer group" if read == "group" else "by offset"
        lines += _table([f"records/s, {pairs} -> 1, read {read_text}"]
                        + [f"{size_label(s)} {scaling.MODE_TEXT[m].split(' (')[0]}" for s, m in cols], rows) + [""]
    ref = doc["streams"].get("reference") or {}
    lines.append("Batched, per system: " + "; ".join(f"{s}: {STREAM_REGISTRY[s].batch_note}"
                                                  for s in dict.fromkeys(r.system for r, _ in results)) + ".")
    if ref:
        lines += ["", f"Reference, published, not measured here: {scaling.si(ref['records_per_s'])} records/s, "
                      f"{ref['what']} ({ref['source']})."]
    return lines + [""] + [f"- not measured: {why}" for why in skipped.values()]


def spark(doc, path, link):
    """python -m bench.spark: rows/s per source -> sink and batch count. The one place that reads
    the Spark run's JSON (docs/spark-bench.json)."""
    labels = {"shmq": "shmq stream", "jvm": "shmq stream (JVM source)", "parquet": "parquet files", "rate": "rate-micro-batch",
              "live": "shmq + live producer", "noop": "noop"}
    st = doc["settings"]
    if not doc.get("command"):
        doc = dict(doc, command="python -m bench.spark" + (" --quick" if st.get("quick") else ""))
    rows = []
    for c in doc["cases"]:
        s = c["summary"]
        name = f"{labels.get(c['source'], c['source'])} → {labels.get(c['sink'], c['sink'])}"
        ok = s.get("ok_runs", 0) > 0 and s.get("overall_rows_per_s")
        rows.append([name, c["batches"], scaling.si(s["overall_rows_per_s"]) if ok else "error",
                     scaling.si(s["steady_rows_per_s"]) if ok else ""])
    lines = [run_line(doc, path, link, st.get("runs"), ("pyspark", "pyarrow")), ""]
    lines += _table(["source → sink", "batches", "overall rows/s", "steady rows/s"], rows) + [""]
    lines.append(f"Spark master {st.get('master')}, {st.get('records', 0):,} records of {st.get('value_bytes')} B in "
                 f"{st.get('partitions')} partitions. overall = rows / (start -> end of the query); steady = the "
                 "batches after the first.")
    return lines


def tcp(doc, path, link):
    """python -m bench.tcp: shmq over TCP against Redis, a row per case and figure, with shmq / Redis and
    issue 44's targets."""
    table = tcp_report.rows(_results(doc))
    lines = [run_line(doc, path, link, doc["settings"]["runs"]), ""] + tcp_report.markdown(table) + [""]
    summary = tcp_report.target_summary(table)
    lines += [summary[:1].upper() + summary[1:] + ".", ""]
    lines += [f"- {text}" for text in tcp_report.legend(tcp_report.cases_of(table))]
    return lines + [""] + _skip_systems(doc)


def jobs(doc, path, link):
    """python -m bench.jobs: jobs/s per tool, mode and broker, with shmq (local) / Redis and issue 29's target."""
    from bench.jobs import BROKERS, TARGET

    by = {(r["tool"], r["broker"], r["mode"]): r for r in doc["rows"]}
    brokers = [b for b in BROKERS if any(k[1] == b for k in by)]
    names = {"shmq": "shmq (local)", "shmq-tcp": "shmq (TCP)", "redis": "Redis"}
    rows = []
    for tool, mode in dict.fromkeys((t, m) for t, _, m in by):
        cells = [by.get((tool, b, mode)) for b in brokers]
        shmq, redis = (by.get((tool, b, mode), {}).get("median") for b in ("shmq", "redis"))
        ratio = shmq / redis if shmq and redis else None
        target = "-" if ratio is None or mode == "chord" else f">= {TARGET:g}x: {'met' if ratio >= TARGET else 'missed'}"
        rows.append([tool.capitalize(), mode] + [("error" if c["error"] else f"{c['median']:,.0f}/s") if c else "-"
                                                 for c in cells] + [f"{ratio:.2f}x" if ratio else "-", target])
    lines = [run_line(doc, path, link, doc.get("runs"), ("celery", "kombu", "dramatiq")), ""]
    lines += _table(["tool", "mode"] + [names[b] for b in brokers] + ["shmq local / Redis", "target (issue 29)"],
                    rows, "ll" + "r" * (len(brokers) + 1) + "l") + [""]
    lines.append(f"{doc['jobs']:,} no-op jobs per run; {doc['processes']} worker processes ({doc['threads']} threads "
                 "each for Dramatiq, prefork for Celery).")
    return lines + [""] + _skip_systems(doc)


def kafka(doc, path, link):
    """python -m bench.kafka: records/s and p50 produce-to-consume per system, with issue 44's targets."""
    from bench.kafka import TARGETS

    names = {"kafka": "Kafka clients via the listener", "shmq-tcp": "shmq's TCP client", "redis-streams": "Redis Streams",
             "kafka-txn": f"the same, transactions of {doc.get('txn_size', 100)} (read_committed)"}
    by = {r["system"]: r for r in doc["rows"] if r["error"] is None}
    lead = by.get("kafka", {}).get("records_per_s")
    goals = {peer: least for system, peer, least in TARGETS if system == "kafka"}
    rows = []
    for r in doc["rows"]:
        name = names.get(r["system"], r["system"])
        if r["error"] is not None:
            rows.append([name, "error", "", "", ""])
            continue
        ratio = lead / r["records_per_s"] if lead and r["system"] != "kafka" else None
        goal = goals.get(r["system"])
        verdict = f">= {goal:g}x: {'met' if ratio >= goal else 'missed'}" if goal and ratio else ""
        rows.append([name, f"{r['records_per_s']:,.0f}", f"{r['p50_us'] / 1000:,.2f} ms",
                     f"{ratio:.2f}x" if ratio else "-", verdict])
    lines = [run_line(doc, path, link, doc.get("runs"), ("confluent-kafka",)), ""]
    lines += _table(["system", "records/s", "p50 produce-to-consume", "Kafka path / system", "target (issue 44)"],
                    rows, "lrrrl") + [""]
    lines.append(f"{doc['records']:,} records of {doc['size']} B per run, one partition, one producer and one group "
                 "consumer process.")
    return lines + [""] + _skip_systems(doc)


def memory(doc, path, link):
    """python -m bench.memory: what one queue and one stream partition hold, empty, full and drained."""
    names = {"shmq": "shmq", "redis": "Redis", "rabbitmq": "RabbitMQ"}
    kinds = {"queue": {"redis": "a list", "rabbitmq": "a classic queue", "shmq": "a queue"},
             "partition": {"redis": "a stream", "shmq": "a stream partition"}}

    def kib(v):
        return "" if v is None else f"{v / 1024:,.1f} KiB"

    rows = [[f"{names.get(r['system'], r['system'])}, {kinds[r['what']].get(r['system'], r['what'])}", "error", "", ""]
            if r["error"] else [f"{names.get(r['system'], r['system'])}, {kinds[r['what']].get(r['system'], r['what'])}",
                                kib(r["empty"]), kib(r["held"]), kib(r.get("drained"))] for r in doc["rows"]]
    payload = doc["count"] * doc["size"] / 1024
    peers = {r["system"] for r in doc["rows"]}
    versions = [v for system, v in (("redis", "redis-server"), ("rabbitmq", "rabbitmq-server")) if system in peers]
    lines = [run_line(doc, path, link, None, versions), ""]
    lines += _table(["one queue or partition", "empty", f"holding {doc['count']:,} x {doc['size']:,} B",
                     "after they are consumed"], rows) + [""]
    lines.append(f"empty: the mean of {doc['empty']} (Redis: each holding one 64 B message, as an empty key does not "
                 f"exist); the payload held is {payload:,.0f} KiB. A stream partition keeps its records after they "
                 "are read (retention drops them).")
    return lines + [""] + _skip_systems(doc)


def compaction(doc, path, link):
    """python -m bench.compaction: appends to a compacted stream while it is compacted, against a stream that is not."""
    cases = {"delete": "not compacted (retention drops)", "housekeeping": "compacted by `shmq server`",
             "continuous": "compacted again and again by another process"}
    rows = [[cases.get(r["case"], r["case"]), str(r["batch"]), f"{r['records_per_s'] / 1000:,.0f} k",
             f"{r['ratio']:.2f}x" if r.get("ratio") else "-", f"{r['p50_us']:.1f}", f"{r['p99_us']:.1f}",
             f"{r['max_us'] / 1000:.1f}", f"{r['compactions']:.0f}", f"{r['compacted_bytes'] / 2**20:,.0f}"]
            for r in doc["rows"]]
    lines = [run_line(doc, path, link, doc.get("runs")), ""]
    lines += _table(["appends to one partition", "records a call", "records/s", "vs not compacted", "call p50 µs",
                     "call p99 µs", "longest call ms", "runs", "MiB taken back"], rows) + [""]
    lines.append(f"{doc['keys']:,} keys, values of {doc['size']} B, {doc['seconds']:g} s a run, a ring of "
                 f"{doc['max_bytes'] / 2**20:g} MiB; runs and MiB: during one run.")
    return lines + [""]


def arrays(doc, path, link):
    """python -m bench.arrays: loaders feeding a trainer numpy arrays, shmq's three ways against the peers."""
    names = {"shmq": "shmq, `put_array` / `array(copy=True)`", "shmq-zc": "shmq, `reserve` / `get(copy=False)` by hand",
             "shmq-arrays": "shmq, `put_array` / `array()` where it lies", "mpqueue": "`multiprocessing.Queue`",
             "shared-memory": "`multiprocessing.shared_memory` by hand", "iceoryx2": "iceoryx2"}

    def size(n):
        return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"

    rows = [[size(r["size"]), f"{r['pairs']}->1", names.get(r["system"], r["system"]), f"{r['arrays_per_s']:,.0f}",
             f"{r['gb_per_s']:.2f}", f"{r['vs_mpqueue']:.2f}x" if r.get("vs_mpqueue") else "-",
             f"{r['vs_iceoryx2']:.2f}x" if r.get("vs_iceoryx2") else "-"] for r in doc["rows"]]
    lines = [run_line(doc, path, link, doc.get("runs"), ("iceoryx2", "numpy")), ""]
    lines += _table(["float32 array", "loaders -> trainer", "system", "arrays/s", "GB/s", "vs multiprocessing.Queue",
                     "vs iceoryx2"], rows, "lllrrrr") + [""]
    lines.append("The trainer reads every element of each array (`x.sum()`); at most 16 arrays in flight in every "
                 "system; iceoryx2 1 -> 1 only (publish-subscribe hands every subscriber every sample).")
    skipped = doc.get("skipped") or {}
    if skipped:
        lines.append("Skipped: " + "; ".join(f"{k}: {v}" for k, v in skipped.items()) + ".")
    return lines + [""]


KINDS = {"scale": scale, "scale-summary": scale_summary, "contention": contention, "matrix": matrix, "rtt": rtt,
         "durability": durability, "streams": streams, "spark": spark, "tcp": tcp, "jobs": jobs, "kafka": kafka,
         "memory": memory, "compaction": compaction, "arrays": arrays}


# ---------------------------------------------------------------- pages


def render_block(kind, path, page_dir, root=ROOT):
    """The lines of one block (``path`` from ``root``); a run not saved yet says so."""
    if kind not in KINDS:
        raise BlockError(f"unknown view {kind!r}; choose from {', '.join(KINDS)}")
    full = os.path.join(root, path)
    if not os.path.exists(full):
        return [f"*No saved run yet (`{path}`).*"]
    with open(full) as fh:
        doc = json.load(fh)
    return KINDS[kind](doc, path, os.path.relpath(full, page_dir))


def render_page(text, page_dir, root=ROOT):
    """The page with every block regenerated. BlockError if the markers do not pair up, a
    begin marker is not ``<!-- bench:begin KIND FILE -->`` or KIND is not a view."""
    marks = [m.group(1) for m in MARK.finditer(text)]
    if marks != ["begin", "end"] * (len(marks) // 2) or len(marks) % 2:
        raise BlockError("bench:begin / bench:end markers do not pair up")
    if len(BLOCK.findall(text)) != len(marks) // 2:
        raise BlockError("a begin marker must read <!-- bench:begin KIND FILE -->")

    def fill(m):
        body = "\n".join(render_block(m["kind"], m["file"], page_dir, root)).rstrip("\n")
        return f"<!-- bench:begin {m['kind']} {m['file']} -->\n{body}\n<!-- bench:end -->"

    return BLOCK.sub(fill, text)


def pages(root=ROOT):
    """The pages that may hold blocks: README.md and docs/*.md (paths from ``root``)."""
    return ["README.md", *sorted(os.path.relpath(p, root) for p in glob.glob(os.path.join(root, "docs", "*.md")))]


def _runs(names=None, root=ROOT):
    """(page, kind, file, doc) of every block's saved run (of the pages ``names``, default ``pages``)."""
    for page in names or pages(root):
        with open(os.path.join(root, page)) as fh:
            text = fh.read()
        for m in BLOCK.finditer(text):
            full = os.path.join(root, m["file"])
            if os.path.exists(full):
                with open(full) as fh:
                    yield page, m["kind"], m["file"], json.load(fh)


def outdated(names=None, root=ROOT, code_root=provenance.ROOT):
    """One line per block (of the pages ``names``, default ``pages``) whose run is older than
    the code it measures (``provenance.changed``): what moved since, by file."""
    out = []
    for page, kind, file, doc in _runs(names, root):
        moved = provenance.changed(doc.get("code"), code_root)
        if moved:
            shown = ", ".join(moved[:6]) + (f" and {len(moved) - 6} more" if len(moved) > 6 else "")
            out.append(f"{page}: {kind} {file} (run of {(doc.get('date') or 'no date')[:10]}) is older "
                       f"than the code it measures: {shown}")
    return out


def expired(names=None, root=ROOT, today=None):
    """One line per block whose run the suite no longer takes (``provenance.expired``: no
    stamp, another layout, too old); a run whose code moved since is not one of them."""
    out = []
    for page, kind, file, doc in _runs(names, root):
        why = provenance.expired(doc.get("date"), doc.get("code"), today)
        if why:
            out.append(f"{page}: {kind} {file} (run of {(doc.get('date') or 'no date')[:10]}): {'; '.join(why)}")
    return out


def stale(names=None, root=ROOT):
    """[(page, regenerated text)] of the pages (``names``, paths from ``root``; default ``pages``)
    whose blocks differ from their saved runs."""
    out = []
    for page in names or pages(root):
        full = os.path.join(root, page)
        with open(full) as fh:
            text = fh.read()
        new = render_page(text, os.path.dirname(full), root)
        if new != text:
            out.append((page, new))
    return out


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench.docs", description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 naming the pages that are stale or show a run older than its code "
                        "(which files moved), or one the suite no longer takes (too old, another layout, unstamped)")
    p.add_argument("pages", nargs="*", help="default: README.md and docs/*.md")
    args = p.parse_args(argv)
    try:
        changed = stale(args.pages)
        old = (expired(args.pages) + outdated(args.pages)) if args.check else []
    except (BlockError, OSError, KeyError, ValueError) as exc:
        print(f"bench.docs: error: {exc}", file=sys.stderr)
        return 2
    for line in old:
        print(f"{line} (run its command again)")
    for page, text in changed:
        if args.check:
            print(f"{page}: stale (python -m bench.docs rewrites it from its saved runs)")
        else:
            with open(os.path.join(ROOT, page), "w") as fh:
                fh.write(text)
            print(f"rewrote {page}")
    return 1 if (changed or old) and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
