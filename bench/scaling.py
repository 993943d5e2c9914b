"""Throughput against the number of workers, as tables: the scale and contention benches' views.

Strategy: a run's [(CaseResult, summary)] become Grids (a title, the worker counts as
columns, a row per system or operation, each cell a figure and its ratio to the row's
one-worker figure); the text report (here) and the Markdown page (bench/docs.py) only
lay Grids out, so a saved run prints and renders exactly as it ran.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from bench import report
from bench.adapters import REGISTRY, acks
from bench.plan import CONTENTION_OPS, OWN, size_label

SHAPE_ORDER = ("P->P", "1->P", "P->1")
SHAPE_TEXT = {"P->P": "P producers -> P consumers", "1->P": "1 producer -> P consumers",
              "P->1": "P producers -> 1 consumer"}
MODE_TEXT = {"msg": "per message", "batch": "batched (64 per call)"}
LEAD_ROW = "shmq / best peer"  # a scale table's last row (peers: the systems not in plan.OWN)


def si(x):
    """Three figures: 1610000 -> '1.61 M', 133000 -> '133 k', 85400 -> '85.4 k'."""
    for div, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if x >= div:
            v = x / div
            return f"{v:.2f} {unit}" if v < 10 else f"{v:.1f} {unit}" if v < 100 else f"{v:.0f} {unit}"
    return f"{x:.0f}"


@dataclass
class Cell:
    """One case: its median (msgs/s) and the ratio to its row's first column, or why it has none."""

    value: float | None = None
    ratio: float | None = None
    label: str = ""  # shown instead of a figure: a status (skipped, error, timeout, not run) or a ratio
    short: bool = False  # a contention run that ran out of messages before its time

    def text(self):
        if self.value is None:
            return self.label
        mark = "*" if self.short else ""
        return si(self.value) + mark + ("" if self.ratio is None else f" ({self.ratio:.2f}x)")


@dataclass
class Grid:
    title: str
    columns: list  # column heads ("1->1", "2->2", ... or "N = 1", ...)
    rows: list = field(default_factory=list)  # [(name, acks, [Cell])]


def _cell(found, first):
    if found is None:
        return Cell(label="not run")
    r, s = found
    if r.status != "ok" or not s.get("msgs_per_s"):
        return Cell(label=r.status)
    value = s["msgs_per_s"]
    base = first[1].get("msgs_per_s") if first and first[0].status == "ok" else None
    short = any(run.get("short") for run in r.runs)
    return Cell(value, value / base if base and first is not found else None, short=short)


def _row(cases, columns):
    """Cells of one row: cases is {column: (result, summary)}; ratios against the first column."""
    first = cases.get(columns[0])
    return [_cell(cases.get(c), first) for c in columns]


def scale_grids(results):
    """A Grid per (shape, size, mode) of a scale run; the 1 -> 1 case is every shape's P = 1."""
    tput = [(r, s) for r, s in results if r.kind == "tput"]
    pairs = sorted({r.pairs for r, _ in tput})
    shapes = [x for x in SHAPE_ORDER if any(r.shape == x and r.pairs > 1 for r, _ in tput)] or ["P->P"]
    systems = list(dict.fromkeys(r.system for r, _ in tput))
    grids = []
    for shape in shapes:
        for size in sorted({r.size for r, _ in tput}):
            for mode in [m for m in MODE_TEXT if any(r.mode == m for r, _ in tput)]:
                grid = Grid(f"{size_label(size)}, {SHAPE_TEXT[shape]}, {MODE_TEXT[mode]}",
                            [shape.replace("P", str(p)) for p in pairs])
                for system in systems:
                    cases = {r.pairs: (r, s) for r, s in tput if (r.system, r.size, r.mode) == (system, size, mode)
                             and (r.pairs == 1 or r.shape == shape)}
                    if cases:
                        grid.rows.append((system, acks(system), _row(cases, pairs)))
                _add_lead(grid)
                grids.append(grid)
    return grids


def _add_lead(grid):
    """A last row: shmq's figure over the best peer's (systems not shmq's own) in each column."""
    rows = {name: cells for name, _, cells in grid.rows}
    peers = [cells for name, cells in rows.items() if name not in OWN]
    if "shmq" not in rows or not peers:
        return
    lead = []
    for i, mine in enumerate(rows["shmq"]):
        best = max((cells[i].value for cells in peers if cells[i].value), default=None)
        lead.append(Cell(label=f"{mine.value / best:.2f}x" if mine.value and best else ""))
    grid.rows.append((LEAD_ROW, "", lead))


def contention_grid(results):
    """One Grid: a row per operation (plan.CONTENTION_OPS' order), a column per N."""
    workers = sorted({r.pairs for r, _ in results})
    grid = Grid(f"{size_label(results[0][0].size) if results else '?'}, N processes on one queue, aggregate msgs/s",
                [f"N = {n}" for n in workers])
    ops = [op for op in CONTENTION_OPS if any((r.system, r.kind, r.mode) == op for r, _ in results)]
    for op in ops:
        cases = {r.pairs: (r, s) for r, s in results if (r.system, r.kind, r.mode) == op}
        grid.rows.append((CONTENTION_OPS[op], "", _row(cases, workers)))
    return grid


def print_grid(grid, out, acks_column=True):
    """A Grid as a text table."""
    cells = [[c.text() for c in cells] for _, _, cells in grid.rows]
    name_w = max([6, *(len(name) for name, _, _ in grid.rows)])
    widths = [max([len(h), *(len(row[i]) for row in cells)]) for i, h in enumerate(grid.columns)]
    head = f"{'':<{name_w}}  " + (f"{'acks':<4}  " if acks_column else "") + "  ".join(
        f"{h:>{w}}" for h, w in zip(grid.columns, widths))
    print(grid.title, file=out)
    print(head, file=out)
    print("-" * len(head), file=out)
    for (name, ack, _), row in zip(grid.rows, cells):
        print(f"{name:<{name_w}}  " + (f"{ack:<4}  " if acks_column else "") + "  ".join(
            f"{c:>{w}}" for c, w in zip(row, widths)), file=out)
    print(file=out)


def print_scale(info, args, skipped, results, notes, out=None):
    """The scale bench's report: header, a table per shape and mode, batch notes, problems (to stdout)."""
    out = out or sys.stdout
    report.print_header(info, args, skipped, out, title="shmq scale benchmark")
    print(f"Aggregate msgs/s against P, one queue; median of {args.runs} runs; (x) = over the system's own "
          f"1 -> 1;\n{LEAD_ROW}: over the fastest system that is not shmq's own, same column; acks: what a "
          "consumer acknowledges (none: a received message is gone)\n", file=out)
    for grid in scale_grids(results):
        print_grid(grid, out)
    systems = list(dict.fromkeys(r.system for r, _ in results))
    if systems:
        print("batch notes:", file=out)
        for system in systems:
            print(f"  {system:<12} {REGISTRY[system].batch_note}", file=out)
        print(file=out)
    report.print_failures(results, out)
    for note in notes:
        print(f"note: {note}", file=out)


def print_contention(info, args, skipped, results, notes, seconds, out=None):
    """The contention bench's report: header, the table, what a short run means, problems (to stdout)."""
    out = out or sys.stdout
    report.print_header(info, args, skipped, out, title="shmq contention benchmark")
    print(f"N processes that only put into one queue (it starts empty) or only take from it (it starts full),\n"
          f"each for {seconds:g} s after a common start; median of {args.runs} runs; (x) = over N = 1\n", file=out)
    grid = contention_grid(results)
    print_grid(grid, out, acks_column=False)
    if any(c.short for _, _, cells in grid.rows for c in cells):
        print("* a run ran out of messages before its time (the queue held too few for that rate: raise --fill)\n",
              file=out)
    report.print_failures(results, out)
    for note in notes:
        print(f"note: {note}", file=out)
