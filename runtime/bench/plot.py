"""PNG plots of benchmark results (matplotlib, Agg canvas: no display, no pyplot state).

:func:`plot_scaling` draws the dict returned by
:func:`runtime.bench.scaling.bench_scaling`. matplotlib is a ``dev`` extra, so
it is imported only when a plot is asked for; without it
:class:`PlotDependencyError` says how to install it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ftlayer.errors import ConfigError, FTLayerError

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

THROUGHPUT_PNG = "scaling_throughput.png"
MEMORY_PNG = "scaling_memory.png"
_DPI = 120


class PlotDependencyError(FTLayerError, ImportError):
    """matplotlib is not installed, so no plot can be drawn."""


def plot_scaling(result: Mapping[str, Any], outdir: Path) -> list[Path]:
    """Write ``outdir/scaling_throughput.png`` and ``outdir/scaling_memory.png``; return their paths.

    - throughput: persist, acker and drain records/s against pending records (log x);
    - memory: bytes per pending record (total and beyond the payload, left axis) and
      INFO used_memory growth in MiB (right axis) against pending records (log x).

    ``outdir`` is created if needed; existing files are overwritten. Raises
    :class:`PlotDependencyError` without matplotlib and
    :class:`~ftlayer.errors.ConfigError` if ``result`` has no points.
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        msg = f"plotting needs matplotlib ({exc}); install it with `pip install matplotlib` or the 'dev' extra"
        raise PlotDependencyError(msg) from exc
    points = sorted(result.get("points") or [], key=lambda p: p["pending"])
    if not points:
        msg = "plot_scaling: the result has no points to plot"
        raise ConfigError(msg)
    outdir.mkdir(parents=True, exist_ok=True)
    pending = [int(p["pending"]) for p in points]
    subtitle = f"{result.get('payload_bytes', '?')} B msgpack payload, {result.get('num_channels', '?')} channels"

    def new_axes() -> tuple[Figure, Axes]:
        fig = Figure(figsize=(8, 5), dpi=_DPI)
        FigureCanvasAgg(fig)  # attaches itself as fig.canvas: rendering without any GUI backend
        return fig, fig.add_subplot()

    # throughput: headroom above the lines keeps the one-row legend off the data
    fig, ax = new_axes()
    series = {label: [float(p[field]) for p in points] for label, field in (
        ("persist", "persist_per_s"), ("acker (XOR updates)", "acker_updates_per_s"),
        ("drain (completing acks)", "drain_per_s"))}
    for (label, ys), marker in zip(series.items(), "os^", strict=True):
        ax.plot(pending, ys, marker=marker, label=label)
    _annotate_series(ax, pending, list(series.values()))
    _pending_axis(ax, pending)
    ax.set_ylabel("throughput (records/s; acker: XOR updates/s)")
    ax.set_ylim(0, 1.3 * max(max(ys) for ys in series.values()))
    ax.set_title(f"ftlayer throughput vs pending records\n{subtitle}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="upper center", ncol=3, fontsize=8)
    fig.tight_layout()
    throughput = outdir / THROUGHPUT_PNG
    fig.savefig(throughput, format="png")

    # memory: bytes per record on the left axis, total used_memory growth on the right
    fig, ax = new_axes()
    per_record = [float(p["bytes_per_pending_record"]) for p in points]
    beyond = [float(p["bytes_per_record_beyond_payload"]) for p in points]
    mib = [float(p["used_memory_bytes"]) / 2**20 for p in points]
    lines = ax.plot(pending, per_record, marker="o", label="bytes per pending record (MEMORY USAGE)")
    lines += ax.plot(pending, beyond, marker="s", label="  of which beyond the payload")
    _annotate_series(ax, pending, [beyond, per_record], fmt="{:.0f} B")
    _pending_axis(ax, pending)
    ax.set_ylabel("bytes per pending record (B)")
    ax.set_ylim(0, 1.5 * max(*per_record, 1.0))
    right = ax.twinx()
    lines += right.plot(pending, mib, marker="^", linestyle="--", color="tab:red",
                        label="Redis used_memory growth (MiB, right axis)")
    _annotate_series(right, pending, [mib], fmt="{:.1f} MiB", color="tab:red")
    right.set_ylabel("used_memory growth (MiB)")
    right.set_ylim(0, 1.15 * max(*mib, 1e-3))  # keeps the red line clear of the B per record labels
    ax.set_title(f"ftlayer Redis memory vs pending records\n{subtitle}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(lines, [str(line.get_label()) for line in lines], loc="upper left", fontsize=8)
    fig.tight_layout()
    memory = outdir / MEMORY_PNG
    fig.savefig(memory, format="png")
    return [throughput, memory]


def _pending_axis(ax: Axes, pending: Sequence[int]) -> None:
    """Log x axis of pending records with one tick per measured size (10k, 1M, ...)."""
    ax.set_xscale("log")
    ax.set_xticks(list(pending), [_short(n) for n in pending])
    ax.minorticks_off()
    ax.set_xlabel("pending records (log scale)")
    if len(pending) == 1:  # a single point: give the log axis some width around it
        ax.set_xlim(pending[0] / 3, pending[0] * 3)


def _annotate_series(
    ax: Axes, xs: Sequence[int], series: Sequence[Sequence[float]], fmt: str = "{:,.0f}", color: str | None = None
) -> None:
    """Label every point with its value; at each x the lowest label goes below its point, the others above.

    A middle value goes below too when its lower neighbour is closer than its upper one,
    so two close lines do not print their labels on top of each other.
    """
    for i, x in enumerate(xs):
        column = sorted(range(len(series)), key=lambda s: series[s][i])
        for rank, s in enumerate(column):
            y = series[s][i]
            below = rank == 0 and len(column) > 1
            if 0 < rank < len(column) - 1:
                lower, upper = series[column[rank - 1]][i], series[column[rank + 1]][i]
                below = y - lower > upper - y
            ax.annotate(fmt.format(y), (x, y), textcoords="offset points", xytext=(0, -12 if below else 6),
                        ha="center", fontsize=7, color=color)


def _short(n: int) -> str:
    """10000 -> '10k', 1000000 -> '1M', 2500 -> '2.5k'."""
    for unit, scale in (("M", 1_000_000), ("k", 1_000)):
        if n >= scale:
            return f"{n / scale:g}{unit}"
    return str(n)


__all__ = ["MEMORY_PNG", "THROUGHPUT_PNG", "PlotDependencyError", "plot_scaling"]
