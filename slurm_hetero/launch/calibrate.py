"""Measure a device's real throughput with torch, store it, and read it back for `plan`/`launch`.

The file (`DEFAULT_OUT`, YAML, the same on every node) maps a device type to its figures
(docs/plan.md, "Measured speeds"); a type is stored under its catalog name only when `plan
--measured` reads it (`stored_type`), since one unknown key makes plan refuse the whole file.
"""

from __future__ import annotations

import contextlib
import functools
import math
import re
import reprlib
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

from slurm_hetero.core.devicespec import Catalog
from slurm_hetero.core.errors import CalibrationError, ConfigError, OutputError, RequestError
from slurm_hetero.core.readfile import MAX_MEASURED_BYTES, read_text
from slurm_hetero.engine.devicegroups import MeasuredShapes, resolve_measured
from slurm_hetero.engine.limits import NETWORK_GBS_RANGE
from slurm_hetero.engine.modelspec import ModelSpec
from slurm_hetero.inventory.document import DuplicateKey, strict_yaml, yaml_problem
from slurm_hetero.inventory.modelconfigs import layer_costs_for, load_model, sequence_length
from slurm_hetero.slurm import syntax
from slurm_hetero.vendors import vendor_traits

DEFAULT_OUT = Path("~/.config/slurm-hetero/measured.yaml")


@dataclass(frozen=True)
class Sizes:
    """Problem sizes (the CPU's keep a run to a few seconds)."""

    matmul: int = 1024
    hidden: int = 256
    heads: int = 4
    seq: int = 128
    batch: int = 4
    warmup: int = 2
    repeats: int = 5
    gemm_tokens: tuple[int, ...] = (64, 256, 1024)
    gemm_widths: tuple[int, ...] = (64, 128, 256, 512)


CPU_SIZES = Sizes()
ACCELERATOR_SIZES = Sizes(
    matmul=8192, hidden=2048, heads=16, seq=2048, batch=4, warmup=3, repeats=10,
    gemm_tokens=(512, 2048, 8192, 16384), gemm_widths=(512, 1024, 2048, 4096, 8192),
)  # fmt: skip


@dataclass(frozen=True)
class Calibration:
    """One device's measured throughput."""

    type: str
    tflops: float
    layer_tflops: float
    tokens_per_s: float
    device: str
    dtype: str
    measured_at: str
    gemm_half_elements: float | None = None
    model: dict[str, Any] | None = None  # what `shapes` measured: {name, seq, hidden, layer_gflops}
    shapes: list[dict[str, Any]] | None = None  # [{tp, micro_batch, fwd_s, bwd_s}]


_DEVICE_KIND = re.compile(r"[a-z][a-z0-9_]{0,31}")


def device_spec(requested: str) -> tuple[str, int | None]:
    """`--device` as (kind, index or None), checked before torch is imported (seconds, 200 MB)."""
    kind, colon, index = requested.partition(":")
    number = syntax.whole_number(index, 5)
    if not _DEVICE_KIND.fullmatch(kind) or (colon and (number is None or number > syntax.MAX_INDEX)):
        raise CalibrationError(
            f"--device {syntax.text(requested)}: not a torch device; use auto, cpu or TYPE[:INDEX] "
            f"(INDEX 0 to {syntax.MAX_INDEX}), e.g. cuda:0"
        )
    return kind, number if colon else None


def pick_device(torch: Any, requested: str = "auto") -> str:
    """`requested` (checked: torch has it), or with `auto` the current accelerator, else cpu."""
    if requested != "auto":
        kind, index = device_spec(requested)
        plugins = [v.torch_package for v in vendor_traits().values() if v.torch_device == kind]
        for package in filter(None, plugins if getattr(torch, kind, None) is None else []):
            with contextlib.suppress(ImportError):  # a vendor's torch plugin registers its device type
                __import__(package)
                break
        module = getattr(torch, kind, None)
        if module is None and kind != "cpu":
            raise CalibrationError(
                f"--device {requested}: torch has no device type {kind!r} here (is the vendor's torch "
                "build or plugin installed?); e.g. --device cuda:0, --device cpu, or auto"
            )
        count = getattr(module, "device_count", None) if kind != "cpu" else None
        if callable(count):
            have = int(count())
            if have == 0 or (index is not None and index >= have):
                raise CalibrationError(
                    f"--device {requested}: no such device ({have} {kind} devices visible)"
                )
        return requested
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None and accelerator.is_available():
        return str(accelerator.current_accelerator().type)
    return "cuda" if torch.cuda.is_available() else "cpu"


def stored_type(name: str, catalog: Catalog) -> str:
    """The catalog type `name` stands for, by `plan --measured`'s own check (`resolve_measured`)."""
    try:
        syntax.gres_type(name)
        [canonical] = resolve_measured({name: 1.0}, catalog)
    except (ValueError, RequestError) as e:
        reason = e.reason if isinstance(e, RequestError) else str(e)
        raise CalibrationError(
            f"device type {name!r}: {reason}; plan --measured reads only these, so name the measured "
            "device with --type TYPE"
        ) from e
    return canonical


def _synchronize(torch: Any, device: str) -> None:
    kind = device.split(":")[0]
    module = getattr(torch, kind, None)
    if kind != "cpu" and module is not None and hasattr(module, "synchronize"):
        module.synchronize()


def median_seconds(torch: Any, device: str, run: Callable[[], object], sizes: Sizes) -> float:
    """Median wall seconds of `run` after warm-up, the device synchronized around each run."""
    for _ in range(sizes.warmup):
        run()
    _synchronize(torch, device)
    times = []
    for _ in range(sizes.repeats):
        start = time.perf_counter()
        run()
        _synchronize(torch, device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def gemm_tflops(torch: Any, device: str, dtype: Any, sizes: Sizes, rows: int, width: int) -> float:
    """Sustained TFLOPS of rows x width by width x width GEMMs."""
    a = torch.randn(rows, width, device=device, dtype=dtype)
    w = torch.randn(width, width, device=device, dtype=dtype)
    seconds = median_seconds(torch, device, functools.partial(torch.matmul, a, w), sizes)
    return 2.0 * rows * width * width / seconds / 1e12


def gemm_points(torch: Any, device: str, dtype: Any, sizes: Sizes) -> list[tuple[float, float]]:
    """(activation elements, TFLOPS) of a micro-batch's GEMMs at each tensor-parallel degree."""
    return [
        (float(tokens * width), gemm_tflops(torch, device, dtype, sizes, tokens, width))
        for tokens in sizes.gemm_tokens
        for width in sizes.gemm_widths
    ]


def fit_gemm_half(points: list[tuple[float, float]]) -> tuple[float, float]:
    """(peak TFLOPS, half-speed elements) of ``TFLOPS = peak x e / (e + half)`` by least squares
    on its linear form ``1 / TFLOPS = 1 / peak + (half / peak) / e``."""
    xs = [1.0 / e for e, _ in points]
    ys = [1.0 / t for _, t in points]
    n, mx, my = len(xs), sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    if n < 2 or var == 0:
        raise CalibrationError("need GEMMs of at least two sizes to fit the size curve")
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var
    intercept = my - slope * mx
    if intercept <= 0:  # throughput still climbing at the largest size measured: half unknown
        return max(t for _, t in points), 0.0
    return 1.0 / intercept, max(0.0, slope / intercept)


def layer_throughput(torch: Any, device: str, dtype: Any, sizes: Sizes) -> tuple[float, float]:
    """(tokens per second, effective TFLOPS) of a transformer layer's forward and backward,
    counting ``3 x (24 h^2 + 4 s h)`` FLOPs per token."""
    h, s, b = sizes.hidden, sizes.seq, sizes.batch
    layer = torch.nn.TransformerEncoderLayer(h, sizes.heads, 4 * h, dropout=0.0, batch_first=True)
    layer = layer.to(device=device, dtype=dtype)
    x = torch.randn(b, s, h, device=device, dtype=dtype, requires_grad=True)
    seconds = median_seconds(torch, device, _run(layer, x, backward=True), sizes)
    tokens = b * s / seconds
    return tokens, tokens * 3.0 * (24.0 * h * h + 4.0 * s * h) / 1e12


def decoder_layer(torch: Any, spec: ModelSpec) -> Any:
    """One pre-norm decoder layer of `spec` (causal GQA attention; MLP gated with SiLU, else GELU)."""
    if spec.is_moe or spec.kv_lora_rank or spec.encoder_layers:
        raise CalibrationError(
            f"--model {spec.name}: calibrate times dense decoder layers only (this one has experts, "
            "latent attention or an encoder); give its shapes measured another way"
        )
    nn, functional = torch.nn, torch.nn.functional
    h, heads, kv, d, f = spec.hidden, spec.heads, spec.kv_heads, spec.head_dim, spec.intermediate

    class Layer(nn.Module):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.norms = nn.ModuleList(nn.LayerNorm(h, bias=spec.norm_bias) for _ in range(2))
            self.q = nn.Linear(h, heads * d, bias=spec.qkv_bias)
            self.kv = nn.Linear(h, 2 * kv * d, bias=spec.qkv_bias)
            self.o = nn.Linear(heads * d, h, bias=spec.o_bias)
            self.up = nn.Linear(h, (2 if spec.gated_mlp else 1) * f, bias=spec.mlp_bias)
            self.down = nn.Linear(f, h, bias=spec.mlp_bias)

        def forward(self, x: Any) -> Any:
            b, s, _ = x.shape
            y = self.norms[0](x)
            q = self.q(y).view(b, s, heads, d).transpose(1, 2)
            k, v = (t.view(b, s, kv, d).transpose(1, 2) for t in self.kv(y).chunk(2, dim=-1))
            if kv != heads:
                k, v = (t.repeat_interleave(heads // kv, dim=1) for t in (k, v))
            a = functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.o(a.transpose(1, 2).reshape(b, s, heads * d))
            u = self.up(self.norms[1](x))
            if spec.gated_mlp:
                gate, u = u.chunk(2, dim=-1)
                u = functional.silu(gate) * u
            else:
                u = functional.gelu(u)
            return x + self.down(u)

    return Layer()


def _run(layer: Any, x: Any, backward: bool) -> Callable[[], object]:
    if backward:
        return lambda: layer(x).sum().backward()
    return lambda: layer(x)


def layer_shapes(
    torch: Any, device: str, dtype: Any, spec: ModelSpec, seq: int, micro_batches: Sequence[int], sizes: Sizes
) -> list[dict[str, Any]]:
    """[{tp: 1, micro_batch, fwd_s, bwd_s}] of one decoder layer of `spec` at `seq` tokens."""
    layer = decoder_layer(torch, spec).to(device=device, dtype=dtype)
    out = []
    for b in micro_batches:
        x = torch.randn(b, seq, spec.hidden, device=device, dtype=dtype, requires_grad=True)
        forward = median_seconds(torch, device, _run(layer, x, backward=False), sizes)
        both = median_seconds(torch, device, _run(layer, x, backward=True), sizes)
        fwd, bwd = _digits(forward), _digits(max(both - forward, forward * 1e-3))
        out.append({"tp": 1, "micro_batch": b, "fwd_s": fwd, "bwd_s": bwd})
    return out


def device_type(torch: Any, device: str, catalog: Catalog) -> str:
    """The Slurm GRES type of `device` from its reported name and the catalog ("cpu" for the CPU)."""
    kind = device.split(":")[0]
    if kind == "cpu":
        return "cpu"
    module = getattr(torch, kind, None)
    name = module.get_device_name(device) if module is not None and hasattr(module, "get_device_name") else ""
    vendors = [v.name for v in vendor_traits().values() if v.torch_device == kind]
    spec = next((s for s in (catalog.resolve(v, name) for v in vendors) if s is not None), None)
    if spec is None:
        raise CalibrationError(f"{device} ({name or 'unnamed'}) is not in the catalog; pass --type GRES_TYPE")
    return spec.type


def calibrate(
    device: str = "auto",
    gres_type: str | None = None,
    dtype: str | None = None,
    sizes: Sizes | None = None,
    catalog: Catalog | None = None,
    model: tuple[str, int | None] | None = None,
    micro_batches: Sequence[int] = (1, 2, 4),
) -> Calibration:
    """Measure one device (default dtype: bf16 on accelerators, fp32 on the CPU); with `model`
    (a model reference and its sequence length, None for its context) also one of its layers per
    micro-batch size."""
    device_spec(device)  # a malformed --device is refused before torch is imported
    try:
        import torch
    except ImportError as e:
        raise CalibrationError("calibrate needs torch: pip install torch (or the vendor's build)") from e
    device = pick_device(torch, device)
    on_cpu = device.startswith("cpu")
    dtype = dtype or ("fp32" if on_cpu else "bf16")
    torch_dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
    sizes = sizes or (CPU_SIZES if on_cpu else ACCELERATOR_SIZES)
    if gres_type is None:
        if catalog is None:
            raise CalibrationError("no catalog to name the device with; pass --type GRES_TYPE")
        gres_type = device_type(torch, device, catalog)
    if catalog is not None:
        gres_type = stored_type(gres_type, catalog)
    try:
        gemm = gemm_tflops(torch, device, torch_dtype, sizes, sizes.matmul, sizes.matmul)
        tokens, layer = layer_throughput(torch, device, torch_dtype, sizes)
        _, half = fit_gemm_half(gemm_points(torch, device, torch_dtype, sizes))
        entry, shapes = None, None
        if model is not None:  # `entry`: what `load_profile` checks a plan's model against
            spec = load_model(model[0])
            seq = sequence_length(spec, model[1], model[0])
            gflops = float(layer_costs_for(model[0], seq).flops.mean()) / 1e9
            entry = {"name": spec.name, "seq": seq, "hidden": spec.hidden, "layer_gflops": _digits(gflops)}
            shapes = layer_shapes(torch, device, torch_dtype, spec, seq, micro_batches, sizes)
    except RuntimeError as e:
        raise CalibrationError(f"measuring {device} failed: {str(e).splitlines()[0]}") from e
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    figures = (_digits(gemm), _digits(layer), _digits(tokens))
    return Calibration(gres_type, *figures, device, dtype, stamp, _digits(half), entry, shapes)


def _digits(value: float) -> float:
    return float(f"{value:.4g}")


# -- the file -------------------------------------------------------------------------------------


def _read(path: Path, what: str = "sustained TFLOPS") -> Mapping[Any, Any]:
    """The measured-throughput YAML (bounded, `readfile`): a mapping of device type to `what`."""
    text = read_text(path, MAX_MEASURED_BYTES, "measured-throughput file", ConfigError)
    try:
        data = strict_yaml(text, str(path), "measured-throughput file")  # `1.5e2` is text in YAML 1.1
    except DuplicateKey as e:  # YAML would keep the last figure silently
        line = f" (line {e.problem_mark.line + 1})" if e.problem_mark else ""
        raise ConfigError(f"{e.problem}{line}; give each key once", str(path)) from e
    except yaml.YAMLError as e:
        raise ConfigError(f"cannot read measured throughput: {yaml_problem(e)}", str(path)) from e
    if not isinstance(data, Mapping):
        raise ConfigError(f"expected a mapping of device type to {what}", str(path))
    return data


# Sustained TFLOPS of one device: a thousand times today's fastest (about 10**3.5) and a millionth
# of one; 1e300 divided the step model by zero.
TFLOPS_RANGE = (1e-6, 1e6)


def _figure(value: Any, path: Path, key: str) -> float:
    """A type's TFLOPS: the plain figure, or an entry's `layer_tflops` (what the planner prices a
    layer at) else its `tflops`; both checked."""
    if not isinstance(value, Mapping):
        return _number(value, "TFLOPS", path, key, *TFLOPS_RANGE)
    if unknown := sorted(map(str, set(value) - ENTRY_KEYS)):  # a misspelt key would be lost
        message = f"unknown keys {', '.join(unknown)[:200]}; an entry has {', '.join(sorted(ENTRY_KEYS))}"
        raise ConfigError(message, str(path), key)
    given = {
        k: _number(value[k], k, path, key, *TFLOPS_RANGE)
        for k in ("tflops", "layer_tflops")
        if value.get(k) is not None
    }
    if not given:
        raise ConfigError("no tflops: give the type's sustained TFLOPS (tflops: N)", str(path), key)
    return given.get("layer_tflops", given.get("tflops", 0.0))


def _number(value: Any, what: str, path: Path, key: str, low: float | None, high: float) -> float:
    """`value` as a float from `low` to `high` (low None: above 0), else one line naming the entry."""
    if _finite(value) and (value > 0 if low is None else value >= low) and value <= high:
        return float(value)
    span = f"a positive number up to {high:g}" if low is None else f"{low:g} to {high:g}"
    given = reprlib.repr(value)[:40]
    advice = "; write a number a float holds" if given in ("inf", "-inf") else ""  # YAML's 1e400
    raise ConfigError(f"{what} must be {span}, got {given}{advice}", str(path), key)


def _finite(value: Any) -> bool:
    """A real number (not a bool, nan or an infinity)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer of 400 digits: no float holds it
        return False


@dataclass(frozen=True)
class Profile:
    """A `--measured` file, read once: per device type its sustained TFLOPS (`_figure`) and, where
    its entry gives them, `gemm_half_elements`, measured shapes and `network_gbs`."""

    tflops: Mapping[str, float]
    gemm_half: Mapping[str, float]
    shapes: Mapping[str, MeasuredShapes]
    network: Mapping[str, float]


NO_PROFILE = Profile({}, {}, {}, {})


def load_profile(path: Path | None) -> Profile:
    """The `--measured` file at `path` (NO_PROFILE for None); a bad entry is a ConfigError naming it."""
    if path is None:
        return NO_PROFILE
    data = _read(path)
    return Profile(
        {str(k): _figure(v, path, str(k)) for k, v in data.items()},
        _optional(data, path, "gemm_half_elements", 0.0, 1e15),  # elements of one GEMM
        _shapes(data, path),
        _optional(data, path, "network_gbs", *NETWORK_GBS_RANGE),  # as `--network-gbs`
    )


def _optional(data: Mapping[Any, Any], path: Path, name: str, low: float, high: float) -> dict[str, float]:
    """Device type -> its entry's figure `name`, checked in [low, high], for the entries that give it."""
    return {
        str(key): _number(value[name], name, path, str(key), low, high)
        for key, value in data.items()
        if isinstance(value, Mapping) and value.get(name) is not None
    }


def store(path: Path, result: Calibration) -> Path:
    """Merge `result` into the YAML file at `path`; no `model` or `shapes` when it measured no model."""
    entry = {
        k: v
        for k, v in asdict(result).items()
        if k != "type" and not (k in ("model", "shapes") and v is None)
    }
    return store_entries(path, {result.type: entry})


# What an entry may hold: what `calibrate` stores, and what `convert-profile` (or the admin) adds:
# `source`, and `network_gbs` (calibrate measures one node: it has no network figure to store).
ENTRY_KEYS = {f.name for f in fields(Calibration)} - {"type"} | {"source", "network_gbs"}


# -- measured shapes (the per-shape profile; `engine.devicegroups.MeasuredShapes`) ----------------

SHAPE_KEYS = {"tp", "micro_batch", "fwd_s", "bwd_s", "tflops"}
MODEL_KEYS = {"name", "seq", "hidden", "layer_gflops"}
MAX_SHAPES = 1024  # points per type
MAX_TP = 64
MAX_MICRO_BATCH = 65_536  # micro-batch sizes a profile converts


def _shape_point(item: Any, path: Path, key: str) -> tuple[int, float, float | None, float | None]:
    if not isinstance(item, Mapping) or set(item) - SHAPE_KEYS:
        extra = sorted(map(str, set(item) - SHAPE_KEYS)) if isinstance(item, Mapping) else []
        what = f"unknown keys {', '.join(extra)}" if extra else f"got {reprlib.repr(item)[:40]}"
        message = f"expected {{tp, micro_batch, fwd_s, bwd_s}} or {{tp, micro_batch, tflops}}; {what}"
        raise ConfigError(message, str(path), key)
    tp = item.get("tp")
    if isinstance(tp, bool) or not isinstance(tp, int) or not 1 <= tp <= MAX_TP or tp & (tp - 1):
        message = f"tp {reprlib.repr(tp)[:20]} is no tensor-parallel degree (a power of two, 1 to {MAX_TP})"
        raise ConfigError(message, str(path), key)
    micro_batch = _number(item.get("micro_batch"), "micro_batch", path, key, None, 1e9)
    timed = "fwd_s" in item or "bwd_s" in item
    if timed == ("tflops" in item):
        raise ConfigError("give either fwd_s and bwd_s (seconds of one layer) or tflops", str(path), key)
    if not timed:
        return tp, micro_batch, None, _number(item["tflops"], "tflops", path, key, *TFLOPS_RANGE)
    fwd_s, bwd_s = (_number(item.get(k), k, path, key, None, 1e6) for k in ("fwd_s", "bwd_s"))
    return tp, micro_batch, fwd_s + bwd_s, None


def _shape_model(value: Any, path: Path, key: str) -> tuple[str, int, int, float]:
    if not isinstance(value, Mapping) or set(value) != MODEL_KEYS:
        message = f"model must be {{{', '.join(sorted(MODEL_KEYS))}}}: what the seconds were measured on"
        raise ConfigError(message, str(path), key)
    seq, hidden = value["seq"], value["hidden"]
    if any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in (seq, hidden)):
        raise ConfigError("model seq and hidden must be positive integers", str(path), key)
    gflops = _number(value["layer_gflops"], "layer_gflops", path, key, None, 1e9)
    return str(value["name"]), seq, hidden, gflops


def _shapes(data: Mapping[Any, Any], path: Path) -> dict[str, MeasuredShapes]:
    """Device type -> its measured shapes, for the types whose entry has `shapes`."""
    out = {}
    for key, value in data.items():
        if not isinstance(value, Mapping) or "shapes" not in value:
            continue
        shapes = value["shapes"]
        if not isinstance(shapes, list) or not 1 <= len(shapes) <= MAX_SHAPES:
            raise ConfigError(
                f"shapes must be a list of 1 to {MAX_SHAPES} points", str(path), f"{key}.shapes"
            )
        points = [_shape_point(item, path, f"{key}.shapes[{i}]") for i, item in enumerate(shapes)]
        seen: set[tuple[int, float]] = set()
        for i, (tp, mb, _, _) in enumerate(points):
            if (tp, mb) in seen:
                raise ConfigError(
                    f"tp {tp} micro_batch {mb:g} is given twice", str(path), f"{key}.shapes[{i}]"
                )
            seen.add((tp, mb))
        model = None
        if "model" in value or any(s is not None for _, _, s, _ in points):
            model = _shape_model(value.get("model"), path, f"{key}.model")
        out[str(key)] = MeasuredShapes(str(key), tuple(points), model)
    return out


def from_sailor(
    profiles: Any,
    sailor_model: str,
    types: Mapping[str, str],
    model: tuple[str, int, int, float],
    blocks: int,
) -> dict[str, Any]:
    """SAILOR's per-GPU profiles (`profiles_tmp.json`: model -> GPU -> micro-batch -> tp -> layer ->
    [fwd, bwd, update] seconds; layers 1..`blocks` the decoder's) as measured entries of our types
    (`types`: theirs -> ours): per (tp, micro-batch) the median seconds of a decoder layer, and
    `tflops` one device's best speed, at tp 1 where profiled. Errors name the key path."""
    source = profiles.get(sailor_model) if isinstance(profiles, Mapping) else None
    if not isinstance(source, Mapping):
        has = ", ".join(map(str, profiles))[:200] if isinstance(profiles, Mapping) else ""
        raise ConfigError(f"no profiles of {sailor_model!r}; it has {has or 'no model names'}")
    name, seq, hidden, gflops = model
    out: dict[str, Any] = {}
    for theirs, ours in types.items():
        if theirs not in source:
            raise ConfigError(
                f"no profile of {theirs!r} for {sailor_model}; it has {', '.join(source) or 'no GPU names'}"
            )
        shapes, best = [], (False, 0.0)  # (a tp-1 shape, one device's TFLOPS): tp 1 first
        where = f"{sailor_model}.{theirs}"
        for mb, by_tp in _sailor_sizes(source[theirs], where, "micro-batch sizes", MAX_MICRO_BATCH):
            for tp, layers in _sailor_sizes(by_tp, f"{where}.{mb}", "tensor-parallel degrees", MAX_TP):
                times = [_sailor_layer(layers, f"{where}.{mb}.{tp}", i) for i in range(1, blocks + 1)]
                fwd, bwd = (statistics.median(t[i] for t in times) for i in (0, 1))
                shapes.append({"tp": tp, "micro_batch": mb, "fwd_s": _digits(fwd), "bwd_s": _digits(bwd)})
                best = max(best, (tp == 1, mb * 3 * gflops / 1e3 / (tp * (fwd + bwd))))
        model_entry = {"name": name, "seq": seq, "hidden": hidden, "layer_gflops": _digits(gflops)}
        out[ours] = {"tflops": _digits(best[1]), "source": f"SAILOR profiles, {sailor_model} on {theirs}"}
        out[ours].update(model=model_entry, shapes=shapes)
    return out


def sailor_network(bandwidths: Any, types: Mapping[str, str], nbytes: float) -> dict[str, float]:
    """Per SAILOR GPU -> our type of `types`, its `network_gbs` at a message of `nbytes`: SAILOR's
    fit (`multizone_bandwidths_het.json`: zone -> GPU -> GPUs -> zone -> GPU -> GPUs -> [coefficients
    of GB/s in log2 of MB, ...]) for one GPU to one of its type in the first zone listing it."""
    out = {}
    zones = bandwidths if isinstance(bandwidths, Mapping) else {}
    for theirs, ours in types.items():
        zone = next((z for z, gpus in zones.items() if isinstance(gpus, Mapping) and theirs in gpus), None)
        if zone is None:
            raise ConfigError(
                f"no network figures of {theirs!r}; give SAILOR's multizone_bandwidths_het.json"
            )
        keys = (zone, theirs, "1", zone, theirs, "1")
        where, entry = ".".join(keys), bandwidths
        for depth, key in enumerate(keys):
            if not isinstance(entry, Mapping) or key not in entry:
                raise ConfigError(
                    f"no key {key!r} (one {theirs} to one in its zone)", key_path=".".join(keys[:depth])
                )
            entry = entry[key]
        fit = entry[0] if isinstance(entry, (list, tuple)) and entry else None
        if not isinstance(fit, (list, tuple)) or not 0 < len(fit) <= 8 or not all(_finite(c) for c in fit):
            raise ConfigError("expected [[coefficients, ...], ...] (1 to 8 coefficients)", key_path=where)
        x = math.log2(nbytes / 1e6)
        gbs = sum(c * x ** (len(fit) - 1 - i) for i, c in enumerate(fit))
        if not _finite(gbs) or not NETWORK_GBS_RANGE[0] <= gbs <= NETWORK_GBS_RANGE[1]:
            raise ConfigError(f"the fit gives {gbs:g} GB/s at {nbytes / 1e6:g} MB", key_path=where)
        out[ours] = _digits(gbs)
    return out


def _sailor_sizes(value: Any, where: str, what: str, most: int) -> list[tuple[int, Any]]:
    """A profile level keyed by sizes ("1", "2", ...), in size order (degrees: powers of two)."""
    if not isinstance(value, Mapping) or not value:
        raise ConfigError(f'expected a mapping of {what} ("1", "2", ...) to profiles', key_path=where)
    sizes = []
    for key, item in value.items():
        size = int(key) if isinstance(key, str) and key.isdigit() and len(key) <= 7 else 0
        if not 0 < size <= most or (most == MAX_TP and size & (size - 1)):
            raise ConfigError(f"{str(key)[:20]!r} is not one of the {what} (1 to {most})", key_path=where)
        sizes.append((size, item))
    return sorted(sizes, key=lambda kv: kv[0])


def _sailor_layer(layers: Any, where: str, index: int) -> tuple[float, float]:
    """Layer `index`'s forward and backward seconds: positive and finite."""
    times = layers.get(str(index)) if isinstance(layers, Mapping) else None
    if isinstance(times, (list, tuple)) and len(times) >= 2 and all(_finite(t) and t > 0 for t in times[:2]):
        return float(times[0]), float(times[1])
    raise ConfigError(
        f"expected [forward s, backward s, ...] of decoder layer {index}, both positive",
        key_path=f"{where}.{index}",
    )


def store_entries(path: Path, entries: Mapping[str, Any]) -> Path:
    """Merge `entries` (type -> entry) into the YAML file at `path` (atomic write)."""
    from slurm_hetero.core.writefile import write_atomic

    path = path.expanduser()
    data = _read(path, "measurements") if path.exists() else {}
    text = yaml.safe_dump({**data, **entries}, sort_keys=False)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # a regular file on the way
        why = "a file of that name is in the way" if isinstance(e, FileExistsError) else e.strerror
        raise OutputError(f"cannot make directory {path.parent}: {why}; give another --out") from None
    write_atomic({path: text}, backup=False)
    return path
