"""`--plot FILE` of `plan` (one training step as a Gantt chart) and `report` (the report as one
figure): matplotlib from the `plot` extra, drawn in memory and written atomically (a full disk
leaves the old file, never a partial one)."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slurm_hetero.core.errors import OutputError
from slurm_hetero.core.writefile import write_bytes_atomic

if TYPE_CHECKING:  # the planner is imported by plan, not by report
    from slurm_hetero.engine.layout import Layout

FORMATS = ("png", "svg", "pdf")


def check_path(path: Path) -> str:
    """The format `path` names by its suffix; a directory or another suffix is refused (matplotlib
    would append `.png` and write elsewhere, silently)."""
    if path.is_dir():
        raise OutputError(f"--plot {path}: a directory; name a file ending in .{', .'.join(FORMATS)}")
    suffix = path.suffix.lower().lstrip(".")
    if suffix not in FORMATS:
        raise OutputError(f"--plot {path}: name a file ending in .{', .'.join(FORMATS)} (the chart's format)")
    return suffix


@contextlib.contextmanager
def _figure(path: Path) -> Iterator[Any]:
    """matplotlib's pyplot (Agg backend); the one figure drawn with it is written to `path`."""
    fmt = check_path(path)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise OutputError("--plot needs matplotlib: pip install matplotlib (or 'slurm-hetero[plot]')") from e
    data = io.BytesIO()
    try:
        yield plt
        plt.gcf().savefig(data, format=fmt)
    finally:
        plt.close("all")
    write_bytes_atomic(path, data.getvalue())


def draw(doc: Mapping[str, Any], path: Path) -> None:
    """Three panels per row of the report: share of capacity, mean queue wait, stranded GiB-hours."""
    with _figure(path) as plt:
        by = doc["by"]
        rows = doc["rows"]
        labels = [r[by] if "type" not in r or by == "type" else f"{r[by]}/{r['type']}" for r in rows]
        panels = [
            ("share of capacity (%)", [100 * (r["share"] or 0) for r in rows]),
            ("mean queue wait (min)", [(r["wait_mean_s"] or 0) / 60 for r in rows]),
            ("stranded gpumem (GiB-h)", [r["stranded_gib_hours"] for r in rows]),
        ]
        vendors = [
            r["vendor"] if by == "vendor" else doc["capacity"].get(r.get("type"), {}).get("vendor", "")
            for r in rows
        ]
        palette = {v: plt.get_cmap("tab10")(i % 10) for i, v in enumerate(sorted(set(vendors)))}
        figure, axes = plt.subplots(1, 3, figsize=(13, 0.45 * len(rows) + 2.2), sharey=True)
        for ax, (title, values) in zip(axes, panels):
            ax.barh(labels, values, color=[palette[v] for v in vendors])
            ax.set_title(title, fontsize=10)
            ax.invert_yaxis()
            ax.grid(axis="x", alpha=0.3)
        axes[0].set_xlim(0, 100)
        handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in palette.values()]
        figure.legend(
            handles, list(palette), loc="lower center", ncol=len(palette), frameon=False, fontsize=9
        )
        figure.suptitle(f"slurm-hetero report by {by}: {doc['since']} .. {doc['until']}", fontsize=11)
        figure.tight_layout(rect=(0, 0.06, 1, 1))


def plot_step(layout: Layout, path: Path) -> None:
    """One training step as a Gantt chart: a row per stage (the busiest replica of each pipeline
    shape), forward and backward boxes per micro-batch, the gradient all-reduce, idle time grey."""
    from slurm_hetero.engine.layout import step_schedules

    with _figure(path) as plt:
        rows = [(p, s, sched) for p, sched in zip(layout.pipelines, step_schedules(layout)) for s in p.stages]
        fig, ax = plt.subplots(figsize=(12, 1.2 + 0.45 * len(rows)))
        ax.set_facecolor("#e6e6e6")
        for y, (_, s, sched) in enumerate(rows):
            mine = sched.stage == s.index
            for backward, color in ((False, "#4c72b0"), (True, "#dd8452")):
                sel = mine & (sched.backward == backward)
                spans = list(zip(sched.start[sel], sched.end[sel] - sched.start[sel]))
                ax.broken_barh(spans, (y - 0.4, 0.8), facecolors=color, edgecolors="white", linewidth=0.3)
            done = float(sched.stage_end[s.index])
            ax.broken_barh(
                [(done - min(s.allreduce_s, s.bwd_s), s.allreduce_s)], (y - 0.25, 0.5), facecolors="#55a868"
            )
        ax.set_yticks(range(len(rows)))
        ax.set_yticklabels([f"{s.type} stage {s.index} (tp {s.tp}, x{len(p.samples)})" for p, s, _ in rows])
        ax.invert_yaxis()
        ax.set_xlim(0, layout.predicted_step_s * 1.01)
        ax.set_xlabel("seconds")
        ax.set_title(
            f"{layout.kind} layout: step {layout.predicted_step_s:.2f} s, bound {layout.bound_step_s:.2f} s, "
            f"efficiency {layout.efficiency:.3f} (grey: idle)"
        )
        legend = [("forward", "#4c72b0"), ("backward", "#dd8452"), ("gradient all-reduce", "#55a868")]
        handles = [plt.Rectangle((0, 0), 1, 1, color=c, label=n) for n, c in legend]
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
        fig.tight_layout()
