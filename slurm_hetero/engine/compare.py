"""`slurm-hetero catalog --compare`: throughput per dollar and per watt, and what each device is
best for.

- **Headline throughput** is the dense 16-bit tensor peak: `bf16_tflops`, else `fp16_tflops`;
  per dollar-hour and per watt divide it by `price_per_hour_usd` and `tdp_w`.
- Three workload scores, each only when every figure it needs is known: ``training``, the
  geometric mean of headline TFLOPS, memory GiB and interconnect GB/s; ``llm_inference``,
  memory GiB x memory bandwidth GB/s (capacity holds weights and KV cache, decode is bandwidth
  bound); ``throughput_inference``, max(int8 TOPS, fp8 TFLOPS) per dollar-hour.
- A device is **best for** a workload when its score ranks in the top third (``ceil(k / 3)``) of
  the ``k`` compared devices with a score for it; a device without one never qualifies, ties
  keep catalog order. Rankings are relative to the devices compared.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from slurm_hetero.core.devicespec import DeviceSpec

SPEC_FIELDS = (
    "type",
    "vendor",
    "name",
    "memory_gib",
    "memory_bandwidth_gbs",
    "bf16_tflops",
    "fp16_tflops",
    "fp32_tflops",
    "int8_tops",
    "fp8_tflops",
    "interconnect",
    "interconnect_gbs",
    "tdp_w",
    "price_per_hour_usd",
    "family",
    "compare_only",
    "estimate",
    "derivation",
    "source",
)

Row = dict[str, Any]
Scorer = Callable[[DeviceSpec], "float | None"]


def headline_tflops(spec: DeviceSpec) -> float | None:
    return spec.bf16_tflops if spec.bf16_tflops is not None else spec.fp16_tflops


def _per(value: float | None, divisor: float | None) -> float | None:
    return None if value is None or not divisor else value / divisor


def _training(spec: DeviceSpec) -> float | None:
    figures = (headline_tflops(spec), spec.memory_gib, spec.interconnect_gbs)
    if any(f is None or f <= 0 for f in figures):
        return None
    return math.prod(f for f in figures if f is not None) ** (1 / 3)


def _llm_inference(spec: DeviceSpec) -> float | None:
    return None if spec.memory_bandwidth_gbs is None else spec.memory_gib * spec.memory_bandwidth_gbs


def _throughput_inference(spec: DeviceSpec) -> float | None:
    low_precision = [v for v in (spec.int8_tops, spec.fp8_tflops) if v is not None]
    return _per(max(low_precision), spec.price_per_hour_usd) if low_precision else None


SCORERS: dict[str, Scorer] = {
    "training": _training,
    "llm_inference": _llm_inference,
    "throughput_inference": _throughput_inference,
}


def spec_row(spec: DeviceSpec) -> Row:
    return {name: getattr(spec, name) for name in SPEC_FIELDS}


def top_third(scores: npt.NDArray[np.float64]) -> npt.NDArray[np.bool_]:
    """NaN ranks last, never wins."""
    known = int(np.count_nonzero(~np.isnan(scores)))
    order = np.argsort(-np.nan_to_num(scores, nan=-np.inf), kind="stable")
    mask = np.zeros(len(scores), dtype=bool)
    mask[order[: math.ceil(known / 3)]] = True
    return mask


def compare(specs: Sequence[DeviceSpec]) -> list[Row]:
    scores = {w: np.array([f(s) for s in specs], dtype=np.float64) for w, f in SCORERS.items()}  # None: NaN
    winners = {workload: top_third(values) for workload, values in scores.items()}
    rows = []
    for i, spec in enumerate(specs):
        headline = headline_tflops(spec)
        row = spec_row(spec)
        row["tflops_16bit"] = headline
        row["tflops_per_dollar_hour"] = _per(headline, spec.price_per_hour_usd)
        row["tflops_per_watt"] = _per(headline, spec.tdp_w)
        row["scores"] = {w: None if math.isnan(v[i]) else float(v[i]) for w, v in scores.items()}
        row["best_for"] = [workload for workload in SCORERS if winners[workload][i]]
        rows.append(row)
    return rows
