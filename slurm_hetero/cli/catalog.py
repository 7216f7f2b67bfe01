"""`slurm-hetero catalog`: the device catalog as a table or JSON, optionally compared
(`engine.compare`); and the text table every command prints."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import click

from slurm_hetero.cli import cli, models_dir_option
from slurm_hetero.core.devicespec import Catalog, DeviceSpec
from slurm_hetero.core.errors import ConfigError
from slurm_hetero.engine.compare import compare, spec_row
from slurm_hetero.inventory.catalog import load_catalog

Formatter = Callable[[Any], str]


def number(digits: int | None = None) -> Formatter:
    def fmt(value: Any) -> str:
        if value is None:
            return "-"
        return f"{value:g}" if digits is None else f"{value:.{digits}f}"

    return fmt


def _text(value: Any) -> str:
    return "-" if value is None else str(value)


def _tflops(row: dict[str, Any]) -> Any:
    return row["bf16_tflops"] if row["bf16_tflops"] is not None else row["fp16_tflops"]


def _type(row: dict[str, Any]) -> str:
    return f"{row['type']}*" if row.get("estimate") else str(row["type"])


def estimate_notes(rows: Sequence[dict[str, Any]]) -> list[str]:
    return [
        f"* {r['type']}: estimate: {' '.join(str(r['derivation']).split())}"
        for r in rows
        if r.get("estimate")
    ]


# (header, value getter, formatter, right-aligned)
Column = tuple[str, Callable[[dict[str, Any]], Any], Formatter, bool]

COLUMNS: list[Column] = [
    ("TYPE", _type, _text, False),
    ("VENDOR", lambda r: r["vendor"], _text, False),
    ("MEM_GIB", lambda r: r["memory_gib"], number(), True),
    ("BW_GB/S", lambda r: r["memory_bandwidth_gbs"], number(), True),
    ("BF16/FP16_TFLOPS", _tflops, number(), True),
    ("INTERCONNECT", lambda r: r["interconnect"], _text, False),
    ("LINK_GB/S", lambda r: r["interconnect_gbs"], number(), True),
    ("TDP_W", lambda r: r["tdp_w"], number(), True),
    ("USD/H", lambda r: r["price_per_hour_usd"], number(2), True),
]

COMPARE_COLUMNS: list[Column] = [
    ("TFLOPS/USD_H", lambda r: r["tflops_per_dollar_hour"], number(1), True),
    ("TFLOPS/W", lambda r: r["tflops_per_watt"], number(2), True),
    ("BEST_FOR", lambda r: ",".join(r["best_for"]) or None, _text, False),
]


def render_table(rows: Sequence[dict[str, Any]], columns: Sequence[Column]) -> str:
    cells = [[fmt(get(row)) for _, get, fmt, _ in columns] for row in rows]
    widths = [max([len(header), *(len(line[i]) for line in cells)]) for i, (header, *_) in enumerate(columns)]

    def line(values: Sequence[str]) -> str:
        aligned = zip(values, widths, columns)
        return "  ".join(v.rjust(w) if col[3] else v.ljust(w) for v, w, col in aligned).rstrip()

    return "\n".join([line([c[0] for c in columns]), *(line(c) for c in cells)])


def _named(specs: Sequence[DeviceSpec], names: Sequence[str], catalog: Catalog) -> list[DeviceSpec]:
    """Only the named types, aliases or families (`ascend910b`: all its SKUs)."""
    if not names:
        return list(specs)
    chosen: list[DeviceSpec] = []
    for name in names:
        found = catalog.named(name)
        if not found:
            raise ConfigError(
                f"no type, alias or family {name!r}; `slurm-hetero catalog` lists the types and "
                f"families: {', '.join(sorted({s.family for s in specs if s.family}))}"
            )
        chosen += [s for s in found if s not in chosen]
    return [s for s in specs if s in chosen]


def _select(specs: Sequence[DeviceSpec], vendors: Sequence[str]) -> list[DeviceSpec]:
    known = sorted({s.vendor for s in specs})
    if unknown := [v for v in vendors if v not in known]:
        raise ConfigError(
            f"no models for vendor {', '.join(unknown)}; the catalog has: {', '.join(known)}",
            key_path="--vendor",
        )
    return [s for s in specs if not vendors or s.vendor in vendors]


@cli.command("catalog")
@click.argument("names", nargs=-1)
@click.option("--vendor", "vendors", multiple=True, help="Only this vendor's models (repeatable).")
@click.option(
    "--compare",
    "compared",
    is_flag=True,
    help="Add TFLOPS per dollar-hour and per watt, and what each device is best for.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON.")
@models_dir_option(
    help="Extra directory of site model files (*.yaml), read after the site dirs (repeatable)."
)
def catalog(names: tuple[str, ...], vendors: tuple[str, ...], compared: bool, **o: Any) -> None:
    """List the known device models (all, or the NAMES given: types, aliases or families such as
    ascend910b): memory, bandwidth, 16-bit TFLOPS, links, power and price. A starred type has
    estimated figures, explained below the table."""
    for directory in o["models_dirs"]:
        if not directory.is_dir():
            raise ConfigError("no such models directory; pass a directory of *.yaml files", str(directory))
    known = load_catalog(o["models_dirs"])
    specs = _select(_named(known.specs, names, known), vendors)
    rows = compare(specs) if compared else [spec_row(s) for s in specs]
    if o["as_json"]:
        click.echo(json.dumps(rows, indent=2))
    else:
        table = render_table(rows, COLUMNS + COMPARE_COLUMNS if compared else COLUMNS)
        click.echo("\n".join([table, *estimate_notes(rows)]))
