"""The candidate shapes the layout solver searches: the pipeline, data and staged families.

Pure, deterministic, no I/O. A `Shape` (`engine.schedule`) is a layout without its layer split;
this module enumerates them for a `LayoutSpec` (`engine.layout`, which owns the rules each family
follows and searches them through `engine.partition`), in a fixed order:

- ``pipeline``: one pipeline through the types, replicated `d` times (`d` divides every count);
- ``data``: every type runs copies of one common pipeline shape (same stages and layer split),
  each type at its own tensor-parallel degree (allocations of up to `MIXED_TP_MAX_WORLD`
  devices), the batch split unevenly over those replicas;
- ``staged``: one pipeline, each type its own stages, tensor- and data-parallel degree (Metis's
  per-type data parallelism); the pipeline's micro-batch is split over a stage's data-parallel
  devices. Bounded to allocations of `STAGED_MAX_WORLD` devices and `STAGED_MAX_STAGES` stages
  per type, types in memory order (either way).

Each shape is tried at every micro-batch size of `LayoutSpec.micro_batch_sizes` that an average
replica can fill (or the one size given).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from typing import TYPE_CHECKING

from slurm_hetero.engine.schedule import LayoutKind, Shape

if TYPE_CHECKING:
    from slurm_hetero.engine.layout import LayoutSpec


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _tp_options(spec: LayoutSpec, group: int, devices: int) -> list[int]:
    per_node = spec.groups[group].per_node
    return [t for t in spec.tp_sizes if devices % t == 0 and all(c % t == 0 for c in per_node)]


def _micro_batches(spec: LayoutSpec, replicas: int) -> list[int]:
    """Micro-batch sizes to try for a shape of `replicas` replicas: the one `micro_batches` implies,
    else the searched sizes an average replica can fill (at least one), else the one given."""
    if spec.micro_batches is not None:
        return [max(1, round(spec.global_batch / (replicas * spec.micro_batches)))]
    if not spec.micro_batch_sizes:
        return [spec.micro_batch_size]
    most = math.ceil(spec.global_batch / replicas)
    return [b for b in spec.micro_batch_sizes if b <= most] or [min(spec.micro_batch_sizes)]


def _orders(spec: LayoutSpec) -> list[tuple[int, ...]]:
    k = len(spec.groups)
    if k <= 5:
        return list(itertools.permutations(range(k)))
    by_memory = tuple(sorted(range(k), key=lambda g: (-spec.groups[g].memory_bytes, g)))
    return [tuple(range(k)), by_memory, by_memory[::-1]]


def _pipeline_shapes(spec: LayoutSpec) -> Iterator[Shape]:
    counts, layers, orders = [g.count for g in spec.groups], spec.costs.layers, _orders(spec)
    for d in _divisors(math.gcd(*counts)):
        options = [[(n // d // t, t) for t in _tp_options(spec, i, n // d)] for i, n in enumerate(counts)]
        for combo in itertools.product(*options):
            if sum(s for s, _ in combo) <= layers:
                for order in orders:
                    line = tuple((g, combo[g][1]) for g in order for _ in range(combo[g][0]))
                    for b in _micro_batches(spec, d):
                        yield Shape(LayoutKind.PIPELINE, (line,), (d,), b)


# Degrees that differ by type multiply the data family's candidates by up to 4 ** types, and their
# loose lower bounds (no all-reduce, no recomputation) would take the split budget of large
# searches (`partition.MAX_SPLITS`): bounded as the staged family is.
MIXED_TP_MAX_WORLD = 256


def _data_shapes(spec: LayoutSpec) -> Iterator[Shape]:
    """Every type runs replicas of `p` stages, each type at its own tensor-parallel degree
    (uniform degrees first; mixed ones up to `MIXED_TP_MAX_WORLD` devices, unless
    `LayoutSpec.mixed_tp` is False)."""
    counts, k = [g.count for g in spec.groups], len(spec.groups)
    for p in (p for p in _divisors(math.gcd(*counts)) if p <= spec.costs.layers):
        options = [_tp_options(spec, g, counts[g] // p) for g in range(k)]
        combos = [c for c in itertools.product(*options) if len(set(c)) == 1]
        if spec.mixed_tp and sum(counts) <= MIXED_TP_MAX_WORLD:
            combos += [c for c in itertools.product(*options) if len(set(c)) > 1]
        for combo in combos:
            lines = tuple(tuple((g, combo[g]) for _ in range(p)) for g in range(k))
            replicas = tuple(n // (p * t) for n, t in zip(counts, combo))
            for b in _micro_batches(spec, sum(replicas)):
                yield Shape(LayoutKind.DATA, lines, replicas, b)


STAGED_MAX_WORLD = 256  # the staged family's candidates grow as a product over types: bounded here
STAGED_MAX_STAGES = 8  # stages per device type in the staged family


def _staged_options(spec: LayoutSpec, group: int) -> list[tuple[int, int, int]]:
    """(stages, tp, dp) of one type in the staged family: stages x tp x dp = its devices."""
    n, out = spec.groups[group].count, []
    for t in _tp_options(spec, group, n):
        out += [(s, t, n // t // s) for s in _divisors(n // t) if s <= STAGED_MAX_STAGES]
    return out


def _staged_shapes(spec: LayoutSpec) -> Iterator[Shape]:
    """One pipeline through every type, each type its own stages, tensor-parallel and
    data-parallel degree (Metis's per-type data parallelism); the micro-batch of the pipeline is
    split over each stage's data-parallel devices. Types in memory order (either way); combinations
    whose types share one degree are the pipeline family's and left to it."""
    k, world = len(spec.groups), sum(g.count for g in spec.groups)
    if k < 2 or world > STAGED_MAX_WORLD:
        return
    options = [_staged_options(spec, g) for g in range(k)]
    by_memory = tuple(sorted(range(k), key=lambda g: (-spec.groups[g].memory_bytes, g)))
    orders = [by_memory, by_memory[::-1]]  # the largest memories first (embedding, activations) or last
    for combo in itertools.product(*options):
        if sum(s for s, _, _ in combo) > spec.costs.layers or len({d for _, _, d in combo}) == 1:
            continue  # one common degree: the pipeline family's shape
        widest = max(d for _, _, d in combo)
        for order in orders:
            line = tuple((g, combo[g][1]) for g in order for _ in range(combo[g][0]))
            dps = tuple(combo[g][2] for g in order for _ in range(combo[g][0]))
            for b in _micro_batches(spec, widest):
                if b * widest <= spec.global_batch:
                    yield Shape(LayoutKind.STAGED, (line,), (1,), b * widest, dps)


def candidate_shapes(spec: LayoutSpec) -> list[Shape]:
    """Every shape the solver considers, in a fixed order."""
    shapes = list(_pipeline_shapes(spec)) if LayoutKind.PIPELINE in spec.kinds else []
    if LayoutKind.DATA in spec.kinds and len(spec.groups) > 1:
        shapes += _data_shapes(spec)
    if LayoutKind.STAGED in spec.kinds:
        shapes += _staged_shapes(spec)
    return shapes
