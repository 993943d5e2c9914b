"""The report: every table a run prints, the ratios in them, and the JSON a run is saved as.

Strategy: tables are computed from [(CaseResult, summary)] and the durability rows alone,
so a saved run (``--report``) prints exactly what the run printed. The JSON keeps every
raw run: machine, settings, skipped systems, notes, cases (a CaseResult each, plus its
summary) and the durability rows.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict

from bench import provenance
from bench.adapters import REGISTRY, STREAM_REGISTRY, acks
from bench.harness import START_METHOD, CaseResult
from bench.machine import STREAM_VERSIONED, VERSIONED, speed_text
from bench.plan import BASELINE, BATCH, KAFKA_REFERENCE, OWN, QUEUE_BYTES, RTT_SIZE, WARMUP, size_label

OWN_STREAMS = ("shmq-stream", "shmq-stream-tcp")  # every other stream system is a peer
STREAM_TARGETS = {"per_record_lead": 10.0, "batched_records_per_s": 3e6, "tcp_vs_redis": 1.0}


def _si(x):
    """1234567 -> '1.23M'."""
    for div, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.2f}{unit}"
    return f"{x:.0f}"


def _case_key(r):
    return (r.kind, r.size, r.mode, r.pairs, r.shape)


def flow(r):
    """A case's producers -> consumers: '4->4', '1->4', '4->1'."""
    return r.shape.replace("P", str(r.pairs))


def _better(r, s):
    """A figure where larger is better: msgs/s, or 1 / RTT p50."""
    if r.kind == "rtt":
        return 1 / s["p50_us"] if s.get("p50_us") else None
    return s.get("msgs_per_s")


def relative(results, own=OWN):
    """{id(result): (vs mpqueue, vs the best peer)}: how many times better (> 1 = better).

    Peers are the systems other than shmq's own (``own``), so shmq's rows say by how
    much it leads or trails the best of the others.
    """
    groups = {}
    for r, s in results:
        if r.status == "ok" and _better(r, s):
            groups.setdefault(_case_key(r), {})[r.system] = _better(r, s)
    out = {}
    for r, s in results:
        mine, group = _better(r, s) if r.status == "ok" else None, groups.get(_case_key(r), {})
        best = max((v for k, v in group.items() if k not in own), default=None)
        out[id(r)] = (_ratio(mine, group.get(BASELINE)), _ratio(mine, best))
    return out


def print_header(info, args, skipped, out, title="shmq local benchmark", versioned=VERSIONED, more=()):
    """Title, machine, Python, load, versions, settings, ``more`` lines, then what was skipped."""
    print(title, file=out)
    cores = f"{info['logical_cpus']} logical CPUs"
    if info["physical_cores"]:
        cores += f", {info['physical_cores']} physical cores"
    if info["usable_cpus"] is not None:
        cores += f", {info['usable_cpus']} usable"
    print(f"machine : {info['cpu']}; {cores}; {info['os']}", file=out)
    print(f"python  : {info['python']}", file=out)
    if info.get("load"):
        before, after = info["load"]
        print(f"load    : 1-minute load average {before:.2f} before the run, {after:.2f} after it", file=out)
    versions = ", ".join(f"{k} {info.get(k) or 'not installed'}" for k in versioned)
    print(f"packages: {versions}", file=out)
    if info.get("python_speed_us"):
        print(f"speed   : {speed_text(info['python_speed_us'])}", file=out)
    pinned = f"CPUs {args.cpus[0]} and {args.cpus[1]}" if args.cpus else "no (OS placement)"
    print(f"settings: runs={args.runs}, quick={args.quick}, start method={START_METHOD}, batch={BATCH}, "
          f"pinned: {pinned}", file=out)
    for line in more:
        print(line, file=out)
    for reason in skipped.values():
        print(f"skipped: {reason}", file=out)
    print(file=out)


def print_head(head, out):
    """A table's column heads, underlined."""
    print(head, file=out)
    print("-" * len(head), file=out)


def _width(systems, least=11):
    return max([least, *map(len, systems)])


def _print_tput(results, runs, out):
    rows = [(r, s) for r, s in results if r.kind == "tput"]
    if not rows:
        return
    rel = relative(results)
    w = _width(r.system for r, _ in rows)
    print(f"Throughput, P producers -> P consumers (separate processes), median of {runs} runs", file=out)
    print("  msg = one message per call; batch = 64 per call (see notes); MB/s = payload, 10^6 B/s;", file=out)
    print("  acks = what the consumer acknowledges: each message, or none (a received message is gone: no "
          "redelivery);", file=out)
    print(f"  vs mpq / vs best peer = msgs/s over {BASELINE}'s / over the fastest peer's (any system but "
          "shmq's own) in the same case", file=out)
    head = (f"{'size':>7}  {'mode':<5}  {'P':>4}  {'system':<{w}}  {'acks':<4}  {'N':>7}  {'msgs/s':>8}  "
            f"{'(min .. max)':<19}  {'MB/s':>8}  {'vs mpq':>7}  {'vs best peer':>12}")
    print_head(head, out)
    for r, s in rows:
        lead = (f"{size_label(r.size):>7}  {r.mode:<5}  {flow(r):>4}  {r.system:<{w}}  "
                f"{acks(r.system):<4}  {r.n:>7}")
        if r.status != "ok":
            print(f"{lead}  {r.status}" + (f": {r.detail}" if r.status == "skipped" else ""), file=out)
            continue
        spread = f"({_si(s['msgs_per_s_min'])} .. {_si(s['msgs_per_s_max'])})"
        vs_base, vs_best = rel[id(r)]
        print(f"{lead}  {_si(s['msgs_per_s']):>8}  {spread:<19}  {s['mb_per_s']:>8.1f}  {vs_base:>7}  {vs_best:>12}",
              file=out)
    print("  batch notes:", file=out)
    for system in dict.fromkeys(r.system for r, _ in rows):
        print(f"    {system:<{w}} {REGISTRY[system].batch_note}", file=out)
    print(file=out)


def _print_rtt(results, runs, out):
    rows = [(r, s) for r, s in results if r.kind == "rtt"]
    if not rows:
        return
    n = rows[0][0].n
    print(f"RTT, {RTT_SIZE} B ping-pong over two queues (a->b, b->a), {n} round trips "
          f"after {WARMUP} warm-up, median of {runs} runs, microseconds", file=out)
    print(f"  vs mpq / vs best peer = {BASELINE}'s / the lowest peer p50 over this system's p50 "
          "(> 1 = lower latency)", file=out)
    rel = relative(results)
    w = _width(r.system for r, _ in rows)
    head = (f"{'system':<{w}}  {'RTT p50':>9}  {'RTT p99':>9}  {'RTT p99.9':>9}  {'p50 (min .. max)':<20}  "
            f"{'vs mpq':>7}  {'vs best peer':>12}")
    print_head(head, out)
    for r, s in rows:
        if r.status != "ok":
            print(f"{r.system:<{w}}  {r.status}" + (f": {r.detail}" if r.status == "skipped" else ""), file=out)
            continue
        spread = f"({s['p50_min_us']:.1f} .. {s['p50_max_us']:.1f})"
        vs_base, vs_best = rel[id(r)]
        print(f"{r.system:<{w}}  {s['p50_us']:>9.1f}  {s['p99_us']:>9.1f}  {s['p999_us']:>9.1f}  {spread:<20}  "
              f"{vs_base:>7}  {vs_best:>12}", file=out)
    print(file=out)


def _ratio(num, den):
    return f"{num / den:.2f}x" if num and den else "n/a"


def _ratio_cell(by_key, mine, peer, stat, invert=False):
    """shmq / peer for one stat (peer / shmq if invert), or the status of a failed side."""
    a, b = by_key.get(mine), by_key.get(peer)
    for side in (a, b):
        if side is not None and side[0].status != "ok":
            who = "shmq" if side is a else "peer"
            return f"{who} {side[0].status}"
    if a is None or b is None:
        return "n/a"
    x, y = a[1].get(stat), b[1].get(stat)
    return _ratio(y, x) if invert else _ratio(x, y)


def _print_ratios(results, out):
    """One table per topology: shmq / peer per throughput row (1 -> 1: then peer / shmq RTT)."""
    for pairs, shape in dict.fromkeys((r.pairs, r.shape) for r, _ in results):
        _print_ratio_table([(r, s) for r, s in results if (r.pairs, r.shape) == (pairs, shape)],
                           shape.replace("P", str(pairs)), out)


def _print_ratio_table(results, topology, out):
    by_key = {(r.system, r.kind, r.size, r.mode): (r, s) for r, s in results}
    peers = list(dict.fromkeys(r.system for r, _ in results if r.system != "shmq"))
    if not any(r.system == "shmq" for r, _ in results) or not peers:
        return
    print(f"Ratios shmq / peer, {topology.replace('->', ' -> ')} (median msgs/s; > 1 means shmq is faster)",
          file=out)
    widths = [max(14, len(p) + 3) for p in peers]
    head = f"{'size':>7}  {'mode':<5}  " + "  ".join(f"{'vs ' + p:>{w}}" for p, w in zip(peers, widths))
    print_head(head, out)
    keys = dict.fromkeys((r.size, r.mode) for r, _ in results if r.kind == "tput")
    for size, mode in keys:
        cells = [_ratio_cell(by_key, ("shmq", "tput", size, mode), (p, "tput", size, mode), "msgs_per_s")
                 for p in peers]
        print(f"{size_label(size):>7}  {mode:<5}  " + "  ".join(f"{c:>{w}}" for c, w in zip(cells, widths)),
              file=out)
    mine = ("shmq", "rtt", RTT_SIZE, "msg")
    if any(r.kind == "rtt" for r, _ in results):
        for stat in ("p50_us", "p99_us"):
            cells = [_ratio_cell(by_key, mine, (p, "rtt", RTT_SIZE, "msg"), stat, invert=True) for p in peers]
            label = f"RTT {stat[:3]}"
            print(f"{label:>14}  " + "  ".join(f"{c:>{w}}" for c, w in zip(cells, widths)), file=out)
        print("  RTT rows are peer RTT / shmq RTT (> 1 means shmq has lower latency)", file=out)
    unacked = [p for p in peers if acks(p) == "none"]
    if unacked:
        print(f"  no acks (a received message is gone): {', '.join(unacked)}; shmq acks every message", file=out)
    print(file=out)


def print_failures(results, out):
    failed = [r for r, _ in results if r.status != "skipped" and (r.status != "ok" or r.detail)]
    if not failed:
        return
    print("Problems", file=out)
    for r in failed:
        if r.kind in ("group", "offset"):  # a stream case: P producers -> 1 consumer, read so
            case = f"{size_label(r.size)} {r.mode} {r.pairs}->1 {r.kind}"
        elif r.shape == "N":  # a contention case: N workers that only put or only take
            case = f"{r.kind} {size_label(r.size)} {r.mode} N = {r.pairs}"
        else:
            case = f"{r.kind} {size_label(r.size)}{f' {r.mode}' if r.kind == 'tput' else ''} {flow(r)}"
        print(f"- {r.system} {case}: {r.status}", file=out)
        for line in r.detail.strip().splitlines():
            print(f"    {line}", file=out)
    print(file=out)


def report(info, args, skipped, results, notes, out=sys.stdout):
    """Print the header, the tables, the ratios, any problems and cleanup notes."""
    print_header(info, args, skipped, out)
    _print_tput(results, args.runs, out)
    _print_rtt(results, args.runs, out)
    _print_ratios(results, out)
    print_failures(results, out)
    for note in notes:
        print(f"note: {note}", file=out)


def write_json(path, measures, info, args, skipped, results, notes, durability=None, extra=None):
    """All raw runs and summaries as JSON (with the durability rows, when given, and ``extra``'s keys),
    dated, with the command that ran it (``args.command``, when the front end set it) and the
    code it measured (``provenance.MEASURES[measures]``)."""
    doc = {
        **provenance.run_header(measures, getattr(args, "command", None)),
        "machine": info,
        "settings": {"runs": args.runs, "quick": args.quick, "batch": BATCH, "warmup": WARMUP,
                     "start_method": START_METHOD, "queue_bytes": QUEUE_BYTES, "run_timeout": args.run_timeout,
                     "pinned_cpus": list(args.cpus)},
        "skipped": skipped,
        "notes": notes,
        "cases": [dict(asdict(r), summary=s) for r, s in results],
    }
    if durability is not None:
        doc["durability"] = durability
    doc.update(extra or {})
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as fh:
        json.dump(doc, fh, indent=2)
        fh.write("\n")


def read_json(path):
    """A document written by write_json, as (info, settings namespace, skipped, results, notes, doc)."""
    with open(path) as fh:
        doc = json.load(fh)
    st = doc["settings"]
    settings = argparse.Namespace(runs=st["runs"], quick=st["quick"], cpus=tuple(st["pinned_cpus"]),
                                  run_timeout=st["run_timeout"])
    fields = {f for f in CaseResult.__dataclass_fields__}
    results = [(CaseResult(**{k: v for k, v in case.items() if k in fields}), case.get("summary", {}))
               for case in doc["cases"]]
    return doc["machine"], settings, doc["skipped"], results, doc["notes"], doc


# ---------------------------------------------------------------- the durability modes


def durability_row(label, results, runs, n):
    """A mode's row from its throughput and ping-pong cases, or the error that stopped it."""
    failed = [r for r, _ in results if r.status != "ok"]
    if failed:
        return {"mode": label, "error": "; ".join(f"{r.kind} {r.status}: {r.detail.strip()}" for r in failed)}
    (_, tput), (_, rtt) = results
    return {"mode": label, "msgs_per_s": tput["msgs_per_s"], "min": tput["msgs_per_s_min"],
            "max": tput["msgs_per_s_max"], "rtt_p50_us": rtt["p50_us"], "rtt_p99_us": rtt["p99_us"],
            "rtt_p999_us": rtt["p999_us"], "runs": runs, "n": n}


def print_durability(rows, out=sys.stdout):
    """One row per durability mode: msgs/s and spread, ratio to memory mode, RTT percentiles."""
    print("Durability modes, 64 B, 1 producer -> 1 consumer (put / get + ack), local attach; "
          f"median of {rows[0].get('runs', '?')} runs", file=out)
    head = (f"{'mode':<12}  {'msgs/s':>10}  {'(min .. max)':<22}  {'vs memory':>9}  {'RTT p50 us':>10}  "
            f"{'p99 us':>8}  {'p99.9 us':>8}")
    print_head(head, out)
    base = rows[0].get("msgs_per_s")
    for r in rows:
        if "error" in r:
            print(f"{r['mode']:<12}  error: {r['error']}", file=out)
            continue
        spread = f"({_si(r['min'])} .. {_si(r['max'])})"
        print(f"{r['mode']:<12}  {r['msgs_per_s']:>10,.0f}  {spread:<22}  {_ratio(r['msgs_per_s'], base):>9}  "
              f"{r['rtt_p50_us']:>10.1f}  {r['rtt_p99_us']:>8.1f}  {r['rtt_p999_us']:>8.1f}", file=out)
    print(file=out)


# ---------------------------------------------------------------- streams (python -m bench.streams)


def _stream_key(r):
    return (r.size, r.mode, r.pairs, r.kind)


def _print_stream_table(results, runs, out):
    rel = relative(results, own=OWN_STREAMS)
    print(f"Streams, P producers -> 1 consumer (separate processes), median of {runs} runs", file=out)
    print("  msg = one record per call on both sides; batch = 64 per call (see notes)", file=out)
    print("  read: group = through a consumer group, committed (acknowledged) before the records are handed on;",
          file=out)
    print("        offset = plain reads from an offset on, nothing committed", file=out)
    print("  rec/s = records appended and read, end to end: from the release until the consumer has the last one;",
          file=out)
    print("  append/s = the producers' own rate in the same runs (all P together); vs best peer = rec/s over the",
          file=out)
    print(f"  fastest peer's ({', '.join(s for s in STREAM_REGISTRY if s not in OWN_STREAMS)}) in the same case",
          file=out)
    head = (f"{'size':>7}  {'mode':<5}  {'P->C':>4}  {'read':<6}  {'system':<15}  {'N':>7}  {'rec/s':>8}  "
            f"{'(min .. max)':<19}  {'MB/s':>7}  {'append/s':>8}  {'vs best peer':>12}")
    print_head(head, out)
    for r, s in results:
        lead = (f"{size_label(r.size):>7}  {r.mode:<5}  {f'{r.pairs}->1':>4}  {r.kind:<6}  {r.system:<15}  "
                f"{r.n:>7}")
        if r.status != "ok":
            print(f"{lead}  {r.status}" + (f": {r.detail}" if r.status == "skipped" else ""), file=out)
            continue
        spread = f"({_si(s['msgs_per_s_min'])} .. {_si(s['msgs_per_s_max'])})"
        append = _si(s["append_per_s"]) if s.get("append_per_s") else "n/a"
        print(f"{lead}  {_si(s['msgs_per_s']):>8}  {spread:<19}  {s['mb_per_s']:>7.1f}  {append:>8}  "
              f"{rel[id(r)][1]:>12}", file=out)
    print("  batch notes:", file=out)
    for system in dict.fromkeys(r.system for r, _ in results):
        print(f"    {system:<15} {STREAM_REGISTRY[system].batch_note}", file=out)
    ref = KAFKA_REFERENCE
    print(f"  reference, published, not measured here: {_si(ref['records_per_s'])} records/s: {ref['what']}",
          file=out)
    print(f"    ({ref['source']})", file=out)
    print(file=out)


def _print_stream_ratios(results, out):
    """shmq's own stream systems over each peer, per case."""
    by_key = {(r.system,) + _stream_key(r): (r, s) for r, s in results}
    peers = [p for p in dict.fromkeys(r.system for r, _ in results) if p not in OWN_STREAMS]
    keys = list(dict.fromkeys(_stream_key(r) for r, _ in results))
    for mine in OWN_STREAMS:
        if not any(r.system == mine for r, _ in results) or not peers:
            continue
        print(f"Ratios {mine} / peer (median rec/s; > 1 means shmq is faster)", file=out)
        head = f"{'size':>7}  {'mode':<5}  {'P->C':>4}  {'read':<6}  " + "  ".join(f"{'vs ' + p:>16}" for p in peers)
        print_head(head, out)
        for key in keys:
            size, mode, pairs, read = key
            cells = [_ratio_cell(by_key, (mine,) + key, (p,) + key, "msgs_per_s") for p in peers]
            print(f"{size_label(size):>7}  {mode:<5}  {f'{pairs}->1':>4}  {read:<6}  "
                  + "  ".join(f"{c:>16}" for c in cells), file=out)
        print(file=out)


def stream_targets(skipped, results):
    """[(target, measured, verdict)] of the streams issue's targets, from one run's cases."""
    ok = {(r.system,) + _stream_key(r): s["msgs_per_s"] for r, s in results if r.status == "ok" and s}
    peers = [p for p in STREAM_REGISTRY if p not in OWN_STREAMS]
    rows = []

    def spread(values, fmt):
        return f"{fmt(min(values))} .. {fmt(max(values))}"

    lead = []
    for key in dict.fromkeys(k[1:] for k in ok if k[0] == "shmq-stream" and k[2] == "msg"):
        theirs = [ok[(p,) + key] for p in peers if (p,) + key in ok]
        if theirs:
            lead.append(ok[("shmq-stream",) + key] / max(theirs))
    want = STREAM_TARGETS["per_record_lead"]
    if lead:
        met = sum(x >= want for x in lead)
        rows.append((f"local, per record: >= {want:.0f}x the best server",
                     f"{spread(lead, lambda x: f'{x:.1f}x')} ({met} of {len(lead)} cases)",
                     "met" if met == len(lead) else "missed"))
    else:
        rows.append((f"local, per record: >= {want:.0f}x the best server", "no peer measured", "not measured"))

    want = STREAM_TARGETS["batched_records_per_s"]
    batched = [v for k, v in ok.items() if k[0] == "shmq-stream" and k[2] == "batch"]
    if batched:
        met = sum(x >= want for x in batched)
        rows.append((f"local, batched: >= {_si(want)} records/s",
                     f"{spread(batched, _si)} records/s ({met} of {len(batched)} cases)",
                     "met" if met == len(batched) else "missed"))

    tcp = []
    for key in dict.fromkeys(k[1:] for k in ok if k[0] == "shmq-stream-tcp"):
        if ("redis-streams",) + key in ok:
            tcp.append(ok[("shmq-stream-tcp",) + key] / ok[("redis-streams",) + key])
    if tcp:
        met = sum(x > STREAM_TARGETS["tcp_vs_redis"] for x in tcp)
        rows.append(("over TCP: ahead of Redis Streams", f"{spread(tcp, lambda x: f'{x:.2f}x')} of Redis "
                     f"({met} of {len(tcp)} cases)", "met" if met == len(tcp) else "missed"))
    else:
        why = skipped.get("shmq-stream-tcp") or skipped.get("redis-streams") or "no case of both ran"
        rows.append(("over TCP: ahead of Redis Streams", f"not measured: {why}", "not measured"))
    return rows


def _print_stream_targets(skipped, results, out):
    rows = stream_targets(skipped, results)
    print("Targets of the streams issue, from this run (median rec/s per case)", file=out)
    width = max(len(t) for t, _, _ in rows)
    for target, measured, verdict in rows:
        print(f"  {target:<{width}}  {verdict:<12}  {measured}", file=out)
    print(file=out)


def print_streams(info, args, skipped, results, notes, out=sys.stdout, header=True):
    """The stream benchmark's tables: header, throughput, ratios, targets, problems, notes."""
    if header:
        print_header(info, args, skipped, out, title="shmq stream benchmark", versioned=STREAM_VERSIONED)
    else:
        for reason in skipped.values():
            print(f"skipped: {reason}", file=out)
    if results:
        _print_stream_table(results, args.runs, out)
        _print_stream_ratios(results, out)
    _print_stream_targets(skipped, results, out)
    print_failures(results, out)
    for note in notes:
        print(f"note: {note}", file=out)


def stream_doc(skipped, results, notes):
    """The "streams" part of a run's JSON (python -m bench), or a stream run's own document's cases."""
    return {"skipped": skipped, "notes": notes, "reference": KAFKA_REFERENCE,
            "cases": [dict(asdict(r), summary=s) for r, s in results]}


def read_stream_doc(part):
    """(skipped, results, notes) of a "streams" part written by stream_doc."""
    fields = {f for f in CaseResult.__dataclass_fields__}
    results = [(CaseResult(**{k: v for k, v in case.items() if k in fields}), case.get("summary", {}))
               for case in part["cases"]]
    return part["skipped"], results, part["notes"]
