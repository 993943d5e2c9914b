"""shmq over TCP against Redis, as one table: bench.tcp's view, printed and on the pages.

Strategy: a run's [(CaseResult, summary)] become Rows (a case, its size and flow, one
figure: a latency percentile or msgs/s; shmq's and Redis's medians, shmq / Redis, and
issue 44's target where it sets one), the text report (here), the Markdown page
(bench/docs.py) and the plot (bench/plot.py) only lay Rows out, so a saved run prints,
renders and draws exactly as it ran. Every ratio is shmq's figure over Redis's: for a
latency below 1 means shmq is faster, for a rate above 1 does.
"""

from __future__ import annotations

import sys
import textwrap
from dataclasses import dataclass, field

from bench import report
from bench.plan import TCP_CASES, size_label
from bench.scaling import si

MINE, PEER = "shmq-tcp", "redis"
SYSTEMS = (MINE, PEER)
VERSIONED = ("shmq", "redis-py", "redis-server")
SERVERS = "shmq server --no-persist; redis-server --save '' --appendonly no; both on loopback, ports of their own"
LATENCIES = (("p50_us", "p50"), ("p99_us", "p99"), ("p999_us", "p99.9"))
RATE = "msgs/s"
# what each system calls, per case (the cases' command-line names, plan.TCP_CASES)
CALLS = {
    MINE: {"pingpong": "put; get + ack(wait=False) on the other side (blocking client)", "put": "put",
           "msg": "put / get + d.ack(wait=False)", "batch": "put_many(64) / get_many(64) + ack_many(wait=False)",
           "pipe": "put(wait=False) per message, flush() at the end"},
    PEER: {"pingpong": "LPUSH; BRPOP on the other side (redis-py)", "put": "LPUSH",
           "msg": "LPUSH / BRPOP (nothing to ack)", "batch": "LPUSH of 64 values / BLMPOP COUNT 64",
           "pipe": "64 LPUSHes per pipeline (transaction=False), the rest at the end"},
}
# issue 44's targets (issue 28's, the ping-pong eased and the one put tightened), all at 64 B:
# (case, flow, figure) -> (shmq / Redis at most ("<=") or at least (">="), bound)
TARGETS = {
    ("pingpong", "1->1", "p50"): ("<=", 0.8),
    ("put", "1->0", "p50"): ("<=", 0.3),
    ("msg", "1->1", RATE): (">=", 1.5),
    ("msg", "4->4", RATE): (">=", 1.5),
    ("batch", "1->1", RATE): (">=", 3.0),
    ("pipe", "1->0", RATE): (">=", 3.0),
}
TARGET_SIZE = 64
WRAP = 110  # the legend's lines


def case_of(r):
    """The command-line name of a result's case (plan.TCP_CASES)."""
    if r.kind == "rtt":
        return "pingpong" if r.shape == "P->P" else "put"
    return r.mode


def case_text(case):
    return {"pingpong": "ping-pong", "put": "one put", "msg": "per message", "batch": "batched (64)",
            "pipe": "pipelined put"}[case]


@dataclass
class Side:
    """One system's figure in a row: its median and spread (max - min over the median), or why it has none."""

    value: float | None = None
    spread: float | None = None
    label: str = "not run"

    def text(self, latency):
        if self.value is None:
            return self.label
        figure = f"{self.value:.1f}" if latency else si(self.value)
        return figure + ("" if self.spread is None else f" ±{50 * self.spread:.0f}%")


@dataclass
class Row:
    """One figure of one case: each system's side, shmq / Redis, and the target it has."""

    case: str  # plan.TCP_CASES key
    size: int
    flow: str  # producers -> consumers: "1->1", "4->4", "1->0" (producers alone)
    figure: str  # "p50", "p99", "p99.9" (microseconds) or RATE
    sides: dict = field(default_factory=dict)  # system -> Side

    @property
    def latency(self):
        return self.figure != RATE

    @property
    def ratio(self):
        mine, peer = self.sides.get(MINE), self.sides.get(PEER)
        if mine and peer and mine.value and peer.value:
            return mine.value / peer.value
        return None

    @property
    def target(self):
        return TARGETS.get((self.case, self.flow, self.figure)) if self.size == TARGET_SIZE else None

    @property
    def verdict(self):
        """"met" / "missed" against the target; "not measured" if a side has no figure; "" without a target."""
        if self.target is None:
            return ""
        if self.ratio is None:
            return "not measured"
        op, bound = self.target
        return "met" if (self.ratio <= bound if op == "<=" else self.ratio >= bound) else "missed"

    def target_text(self):
        return "" if self.target is None else f"{self.target[0]} {self.target[1]:.1f}x {self.verdict}"

    def cells(self):
        """The row as text: case, size, flow, figure, each system's, shmq / Redis, target."""
        unit = f"{self.figure} µs" if self.latency else RATE
        ratio = "n/a" if self.ratio is None else f"{self.ratio:.2f}x"
        return ([case_text(self.case), size_label(self.size), self.flow, unit]
                + [self.sides.get(s, Side()).text(self.latency) for s in SYSTEMS] + [ratio, self.target_text()])


HEAD = ["case", "size", "P->C", "figure", *SYSTEMS, "shmq / redis", "target (issue 44)"]


def _side(found, stat, low=None, high=None):
    if found is None:
        return Side()
    r, s = found
    if r.status != "ok" or not s.get(stat):
        return Side(label=r.status)
    spread = (s[high] - s[low]) / s[stat] if low and len(r.runs) > 1 else None
    return Side(s[stat], spread)


def rows(results):
    """[Row] of a run, in the order its cases ran: three percentiles per latency case, one rate otherwise."""
    by = {}
    for r, s in results:
        by.setdefault((case_of(r), r.size, report.flow(r)), {})[r.system] = (r, s)
    out = []
    for (case, size, flow), found in by.items():
        if case in ("pingpong", "put"):
            for stat, name in LATENCIES:
                limits = ("p50_min_us", "p50_max_us") if stat == "p50_us" else ()
                out.append(Row(case, size, flow, name, {system: _side(found.get(system), stat, *limits)
                                                         for system in SYSTEMS}))
        else:
            out.append(Row(case, size, flow, RATE, {system: _side(found.get(system), "msgs_per_s", "msgs_per_s_min",
                                                                  "msgs_per_s_max") for system in SYSTEMS}))
    return out


def targets(table):
    """[(Row, verdict)] of the rows with a target."""
    return [(row, row.verdict) for row in table if row.target is not None]


def target_summary(table):
    """One line: how many of issue 44's targets this run met, and which it missed."""
    found = targets(table)
    if not found:
        return "targets of issue 44 (64 B): none in this run's cases"
    met = [row for row, v in found if v == "met"]
    missed = [f"{case_text(row.case)} {row.flow} {row.figure}" for row, v in found if v != "met"]
    return (f"targets of issue 44 (64 B): {len(met)} of {len(found)} met"
            + (f"; not met: {', '.join(missed)}" if missed else ""))


def legend(cases):
    """Lines under the table: what the ratio means and what each system calls in each case."""
    lines = ["shmq / redis: shmq's median over Redis's in the same run; for a latency (µs) below 1x means shmq is "
             "faster, for a rate (msgs/s) above 1x does. ±: half the spread of the runs (max - min) over the median.",
             "P->C: producers -> consumers; 4->0: four producers and no consumer (the queue is emptied between runs)."]
    for case in cases:
        lines.append(f"{case_text(case)}: {TCP_CASES[case]}; "
                     + "; ".join(f"{s}: {CALLS[s][case]}" for s in SYSTEMS) + ".")
    return lines


def cases_of(table):
    """The cases of a table, in its order."""
    return list(dict.fromkeys(row.case for row in table))


def print_tcp(info, settings, skipped, results, notes, out=None):
    """The header, the table, its legend, the targets' verdict, any problems and notes (to ``out``, or stdout)."""
    out = out or sys.stdout
    report.print_header(info, settings, skipped, out, title="shmq over TCP against Redis lists (python -m bench.tcp)",
                        versioned=VERSIONED, more=[f"servers : {SERVERS}"
                                                   + ("; shmq over TLS (--tls)" if getattr(settings, "tls", False) else "")
                                                   + (f"; busy polling {settings.busy_poll_us} µs (--busy-poll-us)"
                                                      if getattr(settings, "busy_poll_us", None) is not None else "")
                                                   + (f"; under load: {settings.load} CPU-bound processes beside every case (--load)"
                                                      if getattr(settings, "load", 0) else "")])
    table = rows(results)
    cells = [HEAD] + [row.cells() for row in table]
    widths = [max(len(c[i]) for c in cells) for i in range(len(HEAD))]
    left = 3  # case, size, P->C left-aligned; figures right-aligned

    def line(c):
        return "  ".join(x.ljust(w) if i < left or i == len(HEAD) - 1 else x.rjust(w)
                         for i, (x, w) in enumerate(zip(c, widths))).rstrip()

    print(f"median of {settings.runs} run(s) per figure", file=out)
    report.print_head(line(HEAD), out)
    for c in cells[1:]:
        print(line(c), file=out)
    print(file=out)
    for text in legend(cases_of(table)):
        print(textwrap.fill(text, WRAP, subsequent_indent="  "), file=out)
    print(textwrap.fill(target_summary(table), WRAP, subsequent_indent="  "), file=out)
    print(file=out)
    report.print_failures(results, out)
    for note in notes:
        print(f"note: {note}", file=out)


def markdown(table):
    """The table as Markdown lines (bench/docs.py's "tcp" view)."""
    body = []
    for row in table:
        c = row.cells()
        if row.verdict in ("met", "missed"):
            c[-1] = f"{row.target[0]} {row.target[1]:.1f}x: **{row.verdict}**"
        body.append(c)
    align = ["---"] * 4 + ["---:"] * (len(SYSTEMS) + 1) + ["---"]
    return ["| " + " | ".join(HEAD) + " |", "|" + "|".join(align) + "|"] + ["| " + " | ".join(c) + " |" for c in body]

