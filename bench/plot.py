"""PNG of a benchmark run: throughput by message size per system, RTT percentiles per system."""

from __future__ import annotations

import os


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


def _throughput(ax, title, by_system):
    for system, points in sorted(by_system.items()):
        points.sort()
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=system)
    ax.set(xscale="log", yscale="log", title=title, xlabel="message size (B)", ylabel="msgs/s")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)


def _latency(ax, rtt):
    systems = sorted(rtt)
    width = 0.27
    for i, label in enumerate(("p50", "p99", "p99.9")):
        xs = [k + (i - 1) * width for k in range(len(systems))]
        ax.bar(xs, [rtt[s][i] for s in systems], width, label=label)
    ax.set_xticks(range(len(systems)), systems, rotation=30, ha="right", fontsize=8)
    ax.set(yscale="log", title="ping-pong RTT (64 B)", ylabel="microseconds")
    ax.legend(fontsize=7)


def draw(path, results):
    """Write the PNG; return a one-line message (also when matplotlib is missing)."""
    try:
        import matplotlib
    except ImportError:
        return "plot skipped: matplotlib not installed"
    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    tput, rtt = _series(results)
    panels = sorted(tput) + ([None] if rtt else [])
    if not panels:
        return "plot skipped: no successful cases"
    cols = min(3, len(panels))
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.5 * cols, 4.2 * rows), squeeze=False)
    for ax, key in zip(axes.flat, panels):
        if key is None:
            _latency(ax, rtt)
        else:
            _throughput(ax, f"throughput, {key[0]}, {key[1]} -> {key[1]}", tput[key])
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return f"wrote {path}"
