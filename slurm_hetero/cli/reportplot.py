"""`report --plot FILE`: the report as one figure (matplotlib, from the `plot` extra)."""

from __future__ import annotations

import io
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from slurm_hetero.core.errors import ConfigError, OutputError
from slurm_hetero.core.writefile import write_bytes_atomic

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


def draw(doc: Mapping[str, Any], path: Path) -> None:
    """Three panels per row of the report: share of capacity, mean queue wait, stranded GiB-hours,
    drawn in memory and written atomically (a full disk leaves the old file, never a partial one)."""
    fmt = check_path(path)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("--plot needs matplotlib: pip install 'slurm-hetero[plot]'") from None
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
    figure.legend(handles, list(palette), loc="lower center", ncol=len(palette), frameon=False, fontsize=9)
    figure.suptitle(f"slurm-hetero report by {by}: {doc['since']} .. {doc['until']}", fontsize=11)
    figure.tight_layout(rect=(0, 0.06, 1, 1))
    data = io.BytesIO()
    try:
        figure.savefig(data, format=fmt)
    finally:
        plt.close(figure)
    write_bytes_atomic(path, data.getvalue())
