"""PNG of a benchmark run: throughput by message size per system and topology, RTT
percentiles per system, and the durability modes; throughput against P (bench.scale);
shmq over TCP against Redis (bench.tcp)."""

from __future__ import annotations

import os

from bench.adapters import SYSTEMS, acks
from bench.plan import size_label
from bench.tcp_report import SYSTEMS as TCP_SYSTEMS
from bench.tcp_report import case_text

SYSTEM_ORDER = SYSTEMS  # the registry's order: shmq's own two first, then the peers
PANEL_ORDER = (("msg", 1), ("batch", 1), ("msg", 4), ("batch", 4))


def _series(results):
    """{(mode, pairs): {system: [(size, msgs/s)]}} and {system: (p50, p99, p99.9)} from ok cases."""
    tput, rtt = {}, {}
    for r, s in results:
        if r.status != "ok":
            continue
        if r.kind == "rtt":
            rtt[r.system] = (s["p50_us"], s["p99_us"], s["p999_us"])
        else:
            tput.setdefault((r.mode, r.pairs), {}).setdefault(r.system, []).append((r.size, s["msgs_per_s"]))
    return tput, rtt


def _ordered(systems):
    return sorted(systems, key=lambda s: (SYSTEM_ORDER.index(s) if s in SYSTEM_ORDER else len(SYSTEM_ORDER), s))


def _style(system, colors):
    """One colour per system in every panel; shmq drawn heavier."""
    return dict(color=colors[system], linewidth=2.6 if system == "shmq" else 1.3,
                zorder=3 if system == "shmq" else 2)


def _throughput(ax, title, by_system, colors):
    for system in _ordered(by_system):
        points = sorted(by_system[system])
        label = f"{system} (no acks)" if acks(system) == "none" else system
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label,
                **_style(system, colors))
    ax.set(xscale="log", yscale="log", title=title, xlabel="message size (B)", ylabel="msgs/s")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)


def _latency(ax, rtt):
    systems = _ordered(rtt)
    width = 0.27
    for i, label in enumerate(("p50", "p99", "p99.9")):
        xs = [k + (i - 1) * width for k in range(len(systems))]
        ax.bar(xs, [rtt[s][i] for s in systems], width, label=label)
    ax.set_xticks(range(len(systems)), systems, rotation=30, ha="right", fontsize=8)
    ax.set(yscale="log", title="ping-pong RTT (64 B), lower is better", ylabel="microseconds")
    ax.grid(True, axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=7)


def _durability(ax, rows):
    rows = [r for r in rows if "error" not in r]
    labels = [r["mode"] for r in rows]
    bars = ax.bar(range(len(rows)), [r["msgs_per_s"] for r in rows], color="tab:purple")
    for bar, r in zip(bars, rows):
        ax.annotate(f"p50 {r['rtt_p50_us']:.0f} us", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(rows)), labels, fontsize=8)
    ax.set(yscale="log", title="shmq durability modes (64 B, 1 -> 1)", ylabel="msgs/s")
    ax.grid(True, axis="y", which="both", alpha=0.3)


def _pyplot():
    """matplotlib's pyplot on the Agg backend, or None where matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    return plt


NO_MATPLOTLIB = "plot skipped: matplotlib not installed"


def _save(fig, path):
    plt = _pyplot()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return f"wrote {path}"


def draw(path, results, durability=(), title=""):
    """Write the PNG; return a one-line message (also when matplotlib is missing)."""
    plt = _pyplot()
    if plt is None:
        return NO_MATPLOTLIB
    tput, rtt = _series(results)
    keys = [k for k in PANEL_ORDER if k in tput] + sorted(k for k in tput if k not in PANEL_ORDER)
    panels = [("tput", k) for k in keys] + ([("rtt", None)] if rtt else [])
    if any("error" not in r for r in durability):
        panels.append(("durability", None))
    if not panels:
        return "plot skipped: no successful cases"
    systems = _ordered({s for by_system in tput.values() for s in by_system} | set(rtt))
    palette = plt.get_cmap("tab10" if len(systems) <= 10 else "tab20").colors
    colors = {s: palette[i % len(palette)] for i, s in enumerate(systems)}
    cols = min(3, len(panels))
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.5 * cols, 4.2 * rows), squeeze=False)
    for ax, (kind, key) in zip(axes.flat, panels):
        if kind == "rtt":
            _latency(ax, rtt)
        elif kind == "durability":
            _durability(ax, durability)
        else:
            _throughput(ax, f"throughput, {key[0]}, {key[1]} -> {key[1]}", tput[key], colors)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return _save(fig, path)


def draw_scale(path, results, title=""):
    """Throughput against P, one line per system, a panel per shape and mode (the 1 -> 1
    case is every panel's first point); returns a one-line message, as ``draw``."""
    plt = _pyplot()
    if plt is None:
        return NO_MATPLOTLIB
    import matplotlib.ticker

    from bench.scaling import MODE_TEXT, SHAPE_ORDER, SHAPE_TEXT

    ok = [(r, s) for r, s in results if r.kind == "tput" and r.status == "ok" and s.get("msgs_per_s")]
    shapes = [x for x in SHAPE_ORDER if any(r.shape == x and r.pairs > 1 for r, _ in ok)] or ["P->P"]
    modes = [m for m in MODE_TEXT if any(r.mode == m for r, _ in ok)]
    size = min((r.size for r, _ in ok), default=None)
    if size is None:
        return "plot skipped: no successful cases"
    systems = _ordered({r.system for r, _ in ok})
    palette = plt.get_cmap("tab10").colors
    colors = {s: palette[i % len(palette)] for i, s in enumerate(systems)}
    fig, axes = plt.subplots(len(modes), len(shapes), figsize=(5.2 * len(shapes), 4.2 * len(modes)), squeeze=False)
    pairs = sorted({r.pairs for r, _ in ok})
    for row, mode in enumerate(modes):
        for col, shape in enumerate(shapes):
            ax = axes[row][col]
            for system in systems:
                points = sorted((r.pairs, s["msgs_per_s"]) for r, s in ok
                                if (r.system, r.mode, r.size) == (system, mode, size)
                                and (r.pairs == 1 or r.shape == shape))
                if points:
                    label = f"{system} (no acks)" if acks(system) == "none" else system
                    ax.plot([p for p, _ in points], [v for _, v in points], marker="o", label=label,
                            **_style(system, colors))
            ax.set(xscale="log", yscale="log", xlabel="P", ylabel="msgs/s",
                   title=f"{SHAPE_TEXT[shape]}, {MODE_TEXT[mode]}")
            ax.set_xticks(pairs, [str(p) for p in pairs])
            ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
            ax.grid(True, which="both", alpha=0.3)
    handles = {}
    for ax in axes.flat:  # one legend for all panels: every system in every panel has one colour
        for h, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, h)
    fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=min(len(handles), 7), fontsize=8)
    if title:
        fig.suptitle(f"{title}; {size} B", fontsize=9)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return _save(fig, path)


def _pairs_of_bars(ax, labels, rows, colors):
    """Each system's bar side by side per label, shmq / Redis written above each pair."""
    width = 0.38
    for i, system in enumerate(TCP_SYSTEMS):
        xs = [k + (i - 0.5) * width for k in range(len(rows))]
        values = [row.sides[system].value or 0 for row in rows]
        ax.bar(xs, values, width, label=system, color=colors[system], zorder=2)
    for k, row in enumerate(rows):
        top = max((row.sides[s].value or 0) for s in TCP_SYSTEMS)
        if row.ratio is not None:
            ax.annotate(f"{row.ratio:.2f}x", (k, top), ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(rows)), labels, rotation=30, ha="right", fontsize=8)
    ax.set_yscale("log")
    ax.grid(True, axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=7)


def draw_tcp(path, rows, title=""):
    """bench.tcp's Rows (bench.tcp_report): the latencies, the rates, each pair of bars
    marked with shmq / Redis; returns a one-line message, as ``draw``."""
    plt = _pyplot()
    if plt is None:
        return NO_MATPLOTLIB
    measured = [row for row in rows if any(row.sides[s].value for s in TCP_SYSTEMS)]
    latency = [row for row in measured if row.latency]
    rates = [row for row in measured if not row.latency]
    panels = [p for p in (latency, rates) if p]
    if not panels:
        return "plot skipped: no successful cases"
    palette = plt.get_cmap("tab10").colors
    colors = {s: palette[SYSTEM_ORDER.index(s) % len(palette)] for s in TCP_SYSTEMS}
    fig, axes = plt.subplots(1, len(panels), figsize=(4.0 + 0.5 * sum(map(len, panels)), 4.8), squeeze=False,
                             gridspec_kw={"width_ratios": [len(p) for p in panels]})
    for ax, part in zip(axes.flat, panels):
        if part is latency:
            labels = [f"{case_text(r.case)} {r.figure}" for r in part]
            _pairs_of_bars(ax, labels, part, colors)
            ax.set(title="latency, 64 B (lower is better)", ylabel="microseconds")
        else:
            labels = [f"{case_text(r.case)} {size_label(r.size)} {r.flow}" for r in part]
            _pairs_of_bars(ax, labels, part, colors)
            ax.set(title="throughput (higher is better)", ylabel="msgs/s")
    if title:
        fig.suptitle(f"{title}; above each pair: shmq / Redis", fontsize=9)
    fig.tight_layout()
    return _save(fig, path)
