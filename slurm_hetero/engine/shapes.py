"""The candidate shapes the layout solver searches: the pipeline, data and staged families.

Pure, deterministic: the `Shape`s (`engine.schedule`) of a `LayoutSpec` in a fixed order, each at
every micro-batch size searched, within `MAX_CANDIDATES` (docs/plan.md, "The search is bounded").
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, TypeVar

from slurm_hetero.core.errors import RequestError
from slurm_hetero.engine.schedule import LayoutKind, Shape

if TYPE_CHECKING:
    from slurm_hetero.engine.layout import LayoutSpec

T = TypeVar("T")


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})


MAX_CANDIDATES = 8192  # pipeline candidates; the data and staged families list an eighth each
MAX_TYPES = 64  # device types in one layout (`engine.limits.check_size` refuses more)
ORDER_PERMUTATIONS = 5  # every stage order of up to this many types (if within the budget)
SEARCHED_MICRO_BATCHES = (1, 2, 4, 8)  # per device, what `plan` and `launch` search by default
# A structure counts as this many shapes however many sizes it is tried at, so `--micro-batch`
# lists the same structures as the default.
SIZE_SLOTS = len(SEARCHED_MICRO_BATCHES)


def _bounded_product(
    options: Sequence[Sequence[T]], limit: int, weight: Callable[[T], int] = lambda _: 0, cap: int = 0
) -> tuple[list[tuple[T, ...]], bool]:
    """Up to `limit` combinations of one item of each option list (weights summing to at most `cap`),
    the earliest items first, in bounded work; and whether any were left out."""
    sizes = [len(o) for o in options]
    if not options or 0 in sizes:
        return [], False
    lightest = [min(weight(x) for x in o) for o in options]
    light_rest = list(itertools.accumulate(reversed(lightest), initial=0))[::-1]
    index_rest = list(itertools.accumulate(reversed([n - 1 for n in sizes]), initial=0))[::-1]
    out: list[tuple[T, ...]] = []
    steps = [limit * 64]

    def compose(i: int, left: int, room: int, prefix: tuple[T, ...]) -> Iterator[tuple[T, ...]]:
        if i == len(options):
            yield prefix
            return
        for j in range(max(0, left - index_rest[i + 1]), min(sizes[i] - 1, left) + 1):
            steps[0] -= 1
            if steps[0] < 0:
                return
            w = weight(options[i][j])
            if w + light_rest[i + 1] <= room:
                yield from compose(i + 1, left - j, room - w, (*prefix, options[i][j]))

    room = cap if cap else sum(max(weight(x) for x in o) for o in options)
    for total in range(index_rest[0] + 1):
        for combo in compose(0, total, room, ()):
            out.append(combo)
            if len(out) == limit:
                return out, True
        if steps[0] < 0:
            return out, True
    return out, False


def _tp_options(spec: LayoutSpec, group: int, devices: int) -> list[int]:
    per_node = spec.groups[group].per_node
    return [t for t in spec.tp_sizes if devices % t == 0 and all(c % t == 0 for c in per_node)]


def _micro_batches(spec: LayoutSpec, replicas: int) -> list[int]:
    """Micro-batch sizes to try for a shape of `replicas` replicas, each at most the global batch (an
    uneven split may give a fast replica more than the average)."""
    if spec.micro_batches is not None:
        return [max(1, round(spec.global_batch / (replicas * spec.micro_batches)))]
    return sorted({min(b, spec.global_batch) for b in spec.micro_batch_sizes or (spec.micro_batch_size,)})


def _few_orders(spec: LayoutSpec) -> list[tuple[int, ...]]:
    """Stage orders of many types: as given, by memory (the first stage holds the most activations
    and the embedding) and by speed, either way."""
    k, groups = len(spec.groups), spec.groups
    by_memory = tuple(sorted(range(k), key=lambda g: (-groups[g].memory_bytes, g)))
    by_speed = tuple(sorted(range(k), key=lambda g: (-groups[g].tflops, g)))
    orders = [tuple(range(k)), by_memory, by_memory[::-1], by_speed, by_speed[::-1]]
    return list(dict.fromkeys(orders))


def _pipeline_shapes(spec: LayoutSpec, budget: int) -> tuple[list[Shape], bool]:
    counts, layers = [g.count for g in spec.groups], spec.costs.layers
    divisors = _divisors(math.gcd(*counts))
    each, cut = max(16, budget // len(divisors)), False
    per_d = []
    for d in divisors:
        options = [[(n // d // t, t) for t in _tp_options(spec, i, n // d)] for i, n in enumerate(counts)]
        combos, left = _bounded_product(options, each, lambda o: o[0], layers)
        per_d.append([(d, c) for c in combos])
        cut |= left
    k, sizes = len(counts), {d: _micro_batches(spec, d) for d in divisors}
    orders = list(itertools.permutations(range(k))) if k <= ORDER_PERMUTATIONS else _few_orders(spec)
    structures = [x for row in per_d for x in row]
    if len(structures) * len(orders) * SIZE_SLOTS > budget:
        orders, cut = (_few_orders(spec), True) if len(orders) > 5 else (orders, cut)
        # interleaved, so every data-parallel degree keeps its cheapest first
        structures = [x for row in itertools.zip_longest(*per_d) for x in row if x is not None]
    shapes: list[Shape] = []
    for listed, (d, combo) in enumerate(structures):
        if (listed + 1) * len(orders) * SIZE_SLOTS > budget:
            return shapes, True
        for order in orders:
            line = tuple((g, combo[g][1]) for g in order for _ in range(combo[g][0]))
            shapes += [Shape(LayoutKind.PIPELINE, (line,), (d,), b) for b in sizes[d]]
    return shapes, cut


MIXED_TP_MAX_WORLD = 256  # mixed tp degrees multiply the data family's candidates by up to 4 ** types


def _data_shapes(spec: LayoutSpec, budget: int) -> tuple[list[Shape], bool]:
    """Every type runs replicas of `p` stages, each type at its own tp degree (uniform degrees first)."""
    counts, k, cut, listed = [g.count for g in spec.groups], len(spec.groups), False, 0
    shapes: list[Shape] = []
    for p in (p for p in _divisors(math.gcd(*counts)) if p <= spec.costs.layers):
        options = [_tp_options(spec, g, counts[g] // p) for g in range(k)]
        combos = [(t,) * k for t in spec.tp_sizes if all(t in o for o in options)]
        if spec.mixed_tp and sum(counts) <= MIXED_TP_MAX_WORLD:
            mixed, left = _bounded_product(options, budget)
            combos += [c for c in mixed if len(set(c)) > 1]
            cut |= left
        for combo in combos:
            if (listed := listed + 1) * SIZE_SLOTS > budget:
                return shapes, True
            lines = tuple(tuple((g, combo[g]) for _ in range(p)) for g in range(k))
            replicas = tuple(n // (p * t) for n, t in zip(counts, combo))
            sizes = _micro_batches(spec, sum(replicas))
            shapes += [Shape(LayoutKind.DATA, lines, replicas, b) for b in sizes]
    return shapes, cut


STAGED_MAX_WORLD = 256  # the staged family's candidates grow as a product over types: bounded here
STAGED_MAX_STAGES = 8  # stages per device type in the staged family


def _staged_options(spec: LayoutSpec, group: int) -> list[tuple[int, int, int]]:
    """(stages, tp, dp) of one type in the staged family: stages x tp x dp = its devices."""
    n, out = spec.groups[group].count, []
    for t in _tp_options(spec, group, n):
        out += [(s, t, n // t // s) for s in _divisors(n // t) if s <= STAGED_MAX_STAGES]
    return out


def staged_degrees(spec: LayoutSpec) -> set[int]:
    """The data-parallel degrees the staged family can give any type (one alone: pipeline shapes only)."""
    return {dp for g in range(len(spec.groups)) for _, _, dp in _staged_options(spec, g)}


def _staged_shapes(spec: LayoutSpec, budget: int) -> tuple[list[Shape], bool]:
    """One pipeline through every type, each with its own stages, tp and dp degree (Metis)."""
    k = len(spec.groups)
    options = [_staged_options(spec, g) for g in range(k)]
    by_memory = tuple(sorted(range(k), key=lambda g: (-spec.groups[g].memory_bytes, g)))
    orders = [by_memory, by_memory[::-1]]  # the largest memories first (embedding, activations) or last
    combos, cut = _bounded_product(options, budget, lambda o: o[0], spec.costs.layers)
    shapes: list[Shape] = []
    for combo in combos:
        if len({d for _, _, d in combo}) == 1:
            continue  # one common degree: the pipeline family's shape
        widest = max(d for _, _, d in combo)
        for order in orders:
            line = tuple((g, combo[g][1]) for g in order for _ in range(combo[g][0]))
            dps = tuple(combo[g][2] for g in order for _ in range(combo[g][0]))
            for size in _staged_micro_batches(spec, widest):
                if len(shapes) == budget:
                    return shapes, True
                shapes.append(Shape(LayoutKind.STAGED, (line,), (1,), size, dps))
    return shapes, cut


def staged_micro_batch(spec: LayoutSpec) -> int | None:
    """The staged pipeline's micro-batch when `micro_batches` sets it (None when searched or given)."""
    return None if spec.micro_batches is None else _micro_batches(spec, 1)[0]


def _staged_micro_batches(spec: LayoutSpec, widest: int) -> list[int]:
    """Pipeline micro-batches of a staged shape that give each device of its widest stage a sample."""
    if (fixed := staged_micro_batch(spec)) is not None:
        return [fixed] if fixed >= widest else []
    return [b * widest for b in _micro_batches(spec, widest) if b * widest <= spec.global_batch]


def kinds_for_micro_batch(
    kinds: Sequence[LayoutKind], explicit: bool, micro_batch: int | None
) -> tuple[LayoutKind, ...]:
    """The families to search for a micro-batch size per device (`--micro-batch`): not the staged
    family, which is refused when asked for by name (`explicit`)."""
    if micro_batch is None or LayoutKind.STAGED not in kinds:
        return tuple(kinds)
    if explicit:
        raise RequestError(
            f"--kind staged --micro-batch {micro_batch}",
            "the staged family splits each pipeline micro-batch over stages of different data-parallel "
            "degrees, so its devices cannot all take the same micro-batch; give --micro-batches "
            "(micro-batches per step) instead, or use --kind pipeline or data",
        )
    return tuple(k for k in kinds if k != LayoutKind.STAGED)


def staged_applies(spec: LayoutSpec) -> bool:
    """Two types or more, `STAGED_MAX_WORLD` devices at most."""
    return len(spec.groups) > 1 and sum(g.count for g in spec.groups) <= STAGED_MAX_WORLD


def shape_search(spec: LayoutSpec) -> tuple[list[Shape], tuple[str, ...]]:
    """Every shape the solver considers, and notes on what the bound left out."""
    budget, shapes, notes = spec.max_candidates, [], []
    families = (
        (LayoutKind.PIPELINE, True, _pipeline_shapes, budget),
        (LayoutKind.DATA, len(spec.groups) > 1, _data_shapes, max(1, budget // 8)),
        (LayoutKind.STAGED, staged_applies(spec), _staged_shapes, max(1, budget // 8)),
    )
    for kind, applies, enumerate_family, share in families:
        if kind in spec.kinds and applies:
            found, cut = enumerate_family(spec, share)
            shapes += found
            if cut:
                notes.append(
                    f"search bounded: {len(found)} {kind} candidates of more "
                    f"({len(spec.groups)} device types; those of the least tensor parallelism "
                    "were kept)"
                )
    return shapes, tuple(notes)


def candidate_shapes(spec: LayoutSpec) -> list[Shape]:
    """`shape_search` without its notes."""
    return shape_search(spec)[0]
