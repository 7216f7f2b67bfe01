"""Train a small transformer LM with the uneven layout `slurm-hetero launch` wrote (CPU, gloo).

Under the launcher each rank reads its layout (env SLURM_HETERO_LAYOUT): its stage's blocks, its
replica's slice of every global batch, micro-batches and gradient weight. `--reference` trains the
same model (seed, init, data) in one process on the whole global batch; the losses must agree.
The model has the layout's `num_layers` blocks (d_model 32, vocab 64 unless told), float64, with
Llama's projection names, so `training.parallelize` shards it over tensor-parallel ranks
(`--arch llama`: transformers' own Llama decoder layers, grouped-query attention and SwiGLU, from
a tiny config built in code, no weights downloaded; `pip install transformers`); stages
run on torch.distributed.pipelining (`--schedule 1f1b|gpipe`). `--checkpoint-dir DIR` (default:
what `launch --resume DIR` exported) resumes from the last checkpoint there, whatever layout
wrote it, and saves one after every step.

    srun ... slurm-hetero launch --model gpt2 --global-batch 16 --seq 16 --micro-batch 2 \
        --measured measured.yaml --backend-override gloo -- python examples/train_uneven.py \
        --steps 20 --seq 16 --split both --device-gflops 400 --slow-type l40s --slow-factor 3 \
        --losses-out losses.json
    python examples/train_uneven.py --reference --steps 20 --layers 12 --global-batch 16 --seq 16 \
        --losses-out reference.json

Rank 0 prints `step N loss X` (the global batch's mean loss), then the median step time after
warm-up with each rank's busy (compute) seconds. `--split even` trains with equal layers per stage
and equal samples per replica instead (the plan's `even_step_s`); `--split both` runs the layout's
split, then the even one, and prints the step time each saves against the even split, measured
and predicted (`saved_fraction measured=... predicted=... achieved=measured/predicted`).

Slower devices: `--slow-rank R` / `--slow-type T` (repeatable) with `--slow-factor F` make those
ranks compute F times slower. By default each forward and backward then sleeps F - 1 times what it
took, so compute time scales with the work. CPU contention, stalls and fixed costs (the gradient
all-reduce, the optimizer) blur that on a shared machine, so `--device-gflops G` emulates devices
instead: every forward and backward lasts its FLOPs (as the planner counts them, of the layout's
model: `--flops-model`) over G GFLOP/s, G / F on slowed ranks, the real compute running inside that
time (a warning counts computations that outlast it). Plan with the same speeds, e.g.
measured.yaml = ``{a100_80g: 0.4, l40s: 0.1333}`` (TFLOPS) for G = 400 and F = 3 on the l40s ranks.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from slurm_hetero import training
from slurm_hetero.core.errors import HeteroError
from slurm_hetero.inventory.modelconfigs import bundled_names, layer_costs_for
from slurm_hetero.training import checkpoint


@dataclass(frozen=True)
class Config:
    """The model, the data and the optimizer; the same on every rank and in the reference."""

    vocab: int = 64
    d_model: int = 32
    heads: int = 4
    layers: int = 4
    seq: int = 16
    global_batch: int = 16
    seed: int = 0
    lr: float = 3e-3
    optimizer: str = "adam"
    dtype: str = "float64"
    arch: str = "own"  # or "llama": transformers' Llama decoder layers, from a tiny config


# -- the model: Sequential(embed, *blocks, head) -----------------------------------------------


class Embed(nn.Module):
    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.tokens = nn.Embedding(cfg.vocab, cfg.d_model)
        self.positions = nn.Parameter(torch.randn(cfg.seq, cfg.d_model) * 0.02)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.tokens(ids) + self.positions[: ids.shape[1]]


class Attention(nn.Module):
    """Causal self-attention, projections named as Llama's (`training.tensor.LLAMA_PLAN` shards
    them by heads: the views take the head count from the shard)."""

    def __init__(self, cfg: Config) -> None:
        super().__init__()
        d, self.head_dim = cfg.d_model, cfg.d_model // cfg.heads
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(d, d) for _ in range(3))
        self.o_proj = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = (
            p(x).view(b, s, -1, self.head_dim).transpose(1, 2)
            for p in (self.q_proj, self.k_proj, self.v_proj)
        )
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(att.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.up_proj, self.down_proj = (
            nn.Linear(cfg.d_model, 4 * cfg.d_model),
            nn.Linear(4 * cfg.d_model, cfg.d_model),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.gelu(self.up_proj(x)))


class Block(nn.Module):
    """Pre-norm causal self-attention and MLP."""

    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(cfg.d_model), nn.LayerNorm(cfg.d_model)
        self.self_attn, self.mlp = Attention(cfg), MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Head(nn.Module):
    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.norm, self.out = nn.LayerNorm(cfg.d_model), nn.Linear(cfg.d_model, cfg.vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.norm(x))


def build_model(cfg: Config) -> nn.Sequential:
    """The whole model, seeded: every rank builds all of it, then keeps its stage."""
    torch.manual_seed(cfg.seed)
    if cfg.arch == "llama":
        return build_llama(cfg).to(getattr(torch, cfg.dtype))
    blocks = [Block(cfg) for _ in range(cfg.layers)]
    return nn.Sequential(Embed(cfg), *blocks, Head(cfg)).to(getattr(torch, cfg.dtype))


class LlamaBlock(nn.Module):
    """One of transformers' `LlamaDecoderLayer`s with the rotary embedding its model would pass it
    (causal: no attention mask, sdpa)."""

    def __init__(self, layer: nn.Module, rotary: nn.Module) -> None:
        super().__init__()
        self.layer, self.rotary = layer, rotary

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(x.shape[1], device=x.device)[None]
        out = self.layer(x, position_ids=positions, position_embeddings=self.rotary(x, positions))
        return out[0] if isinstance(out, tuple) else out


class LlamaHead(nn.Module):
    def __init__(self, norm: nn.Module, out: nn.Module) -> None:
        super().__init__()
        self.norm, self.out = norm, out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.norm(x))


def build_llama(cfg: Config) -> nn.Sequential:
    """A small Llama (`transformers`, a tiny config built here, no weights downloaded) as
    ``Sequential(embed, *decoder layers, head)``: grouped-query attention with half as many kv
    heads, SwiGLU MLP, RMSNorm, rotary positions."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=cfg.vocab, hidden_size=cfg.d_model, intermediate_size=2 * cfg.d_model,
        num_hidden_layers=cfg.layers, num_attention_heads=cfg.heads,
        num_key_value_heads=max(1, cfg.heads // 2), max_position_embeddings=cfg.seq,
        attn_implementation="sdpa",
    )  # fmt: skip
    whole = LlamaForCausalLM(config)
    inner = whole.model
    blocks = [LlamaBlock(layer, inner.rotary_emb) for layer in inner.layers]
    return nn.Sequential(inner.embed_tokens, *blocks, LlamaHead(inner.norm, whole.lm_head))


def make_optimizer(params: Any, cfg: Config) -> torch.optim.Optimizer:
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr * 30, momentum=0.9)
    return torch.optim.Adam(params, lr=cfg.lr)


def tokens(cfg: Config, step: int) -> torch.Tensor:
    """Step `step`'s global batch, `(global_batch, seq + 1)` token ids: strided runs with 10% noise."""
    g = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
    b, n = cfg.global_batch, cfg.seq + 1
    start, stride = torch.randint(cfg.vocab, (b, 1), generator=g), torch.randint(1, 4, (b, 1), generator=g)
    runs = (start + stride * torch.arange(n)) % cfg.vocab
    noise = torch.rand(b, n, generator=g) < 0.1
    return torch.where(noise, torch.randint(cfg.vocab, (b, n), generator=g), runs)


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


# -- training --------------------------------------------------------------------------------


def reference(cfg: Config, steps: int) -> list[float]:
    """Losses of one process training on the whole global batch."""
    model = build_model(cfg)
    opt, losses = make_optimizer(model.parameters(), cfg), []
    for step in range(steps):
        ids = tokens(cfg, step)
        loss = lm_loss(model(ids[:, :-1]), ids[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


def stage_flops(
    cfg: Config, layout: dict[str, Any], model: str | None = None, seq: int | None = None
) -> dict[str, float]:
    """Forward and backward FLOPs per sample of this rank's stage as the planner counts them
    (``2 * params * seq + 4 * seq**2 * d`` per block, ``2 * seq * d * vocab`` for the head; backward
    twice forward plus the forward again of recomputed blocks; split over tensor parallel ranks),
    for this model or, with `model`, a model the planner knows at `seq` tokens."""
    if model:
        costs = layer_costs_for(model, seq or cfg.seq)
        blocks, first, last = costs.flops.tolist(), costs.first_flops, costs.last_flops
    else:
        d, s = cfg.d_model, cfg.seq
        blocks, first, last = [2 * 12 * d * d * s + 4 * s * s * d] * cfg.layers, 0.0, 2 * s * d * cfg.vocab
    a, e, r = layout["layer_start"], layout["layer_end"], layout.get("recompute", 0)
    ends = first * (layout["stage"] == 0) + last * (layout["stage"] == layout["num_stages"] - 1)
    forward = (sum(blocks[a:e]) + ends) / layout.get("tp_size", 1)
    return {"forward": forward, "backward": 2 * forward + sum(blocks[a : a + r]) / layout.get("tp_size", 1)}


class Pace:
    """Makes this rank compute like a device `factor` times slower: each forward or backward lasts
    `factor` times what it took, or with `gflops`, its FLOPs over ``gflops / factor`` GFLOP/s (a
    device emulated whatever the CPU is doing, the real compute running inside that time)."""

    def __init__(
        self, factor: float, flops: dict[str, float] | None = None, gflops: float | None = None
    ) -> None:
        self.factor, self.flops, self.gflops = factor, flops or {}, gflops
        self.busy, self.overruns = 0.0, 0
        # the backward begun (start, samples); the next one replaces it: torch's shape inference
        # runs a backward that computes no parameter gradient, so it never ends in backward_done
        self.begun: tuple[float, int] | None = None

    def backward_done(self) -> None:
        """A backward of the stage ended (its parameters' gradients are all there): pace it."""
        if self.begun is not None:
            (start, samples), self.begun = self.begun, None
            self(time.perf_counter() - start, "backward", samples)

    def __call__(self, seconds: float, phase: str, samples: int) -> None:
        if self.gflops:
            target = self.factor * samples * self.flops[phase] / (self.gflops * 1e9)
            self.overruns += target < seconds
        else:
            target = self.factor * seconds
        time.sleep(max(0.0, target - seconds))
        self.busy += max(target, seconds)


class Paced(nn.Module):
    """The stage, each forward timed and paced (`Pace`); backwards are paced from the output's
    gradient to the last parameter gradient of the stage."""

    def __init__(self, inner: nn.Module, pace: Pace) -> None:
        super().__init__()
        self.inner, self.pace = inner, pace

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        start = time.perf_counter()
        y = self.inner(x)
        self.pace(time.perf_counter() - start, "forward", x.shape[0])
        return _BackwardClock.apply(y, self.pace, x.shape[0])


class _BackwardClock(torch.autograd.Function):
    """Identity; its backward starts the clock the stage's backward is paced by (`Pace.backward_done`)."""

    @staticmethod
    def forward(ctx: Any, y: torch.Tensor, pace: Pace, samples: int) -> torch.Tensor:
        ctx.pace, ctx.samples = pace, samples
        return y.view_as(y)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        ctx.pace.begun = (time.perf_counter(), ctx.samples)
        return grad, None, None


@dataclass
class Run:
    losses: list[float]
    step_s: list[float]
    busy_s: list[float]
    overruns: list[int]
    first_step: int = 0
    loaded: float = 0.0  # when the checkpoint it resumed from was loaded, Unix time
    ended: list[float] = dataclasses.field(default_factory=list)  # each step's end, Unix time


def train(
    cfg: Config,
    dist: training.Distributed,
    layout: dict[str, Any],
    steps: int,
    pace: Pace,
    schedule: str,
    checkpoints: str | None = None,
) -> Run:
    """Train up to step `steps` of this rank's stage; every rank returns the global losses. With
    `checkpoints`, first resume from the last checkpoint there (whatever layout wrote it), and
    save one after every step."""
    stage = training.parallelize(training.stage_modules(build_model(cfg), layout), dist.group("tp"))
    pipe = training.Pipeline(Paced(stage, pace), dataclasses.replace(dist, layout=layout), lm_loss, schedule)
    params = [p for p in stage.parameters() if p.requires_grad]
    torch.autograd.graph.register_multi_grad_hook(params, lambda _: pace.backward_done(), mode="all")
    opt, run = make_optimizer(params, cfg), Run([], [], [], [])
    first, start = layout["sample_offset"], 0
    if checkpoints and os.path.lexists(Path(checkpoints) / checkpoint.LATEST):  # a broken link: load says so
        start = checkpoint.load(checkpoints, stage, opt, layout)["extra"]["next_step"]
        run.first_step, run.loaded = start, time.time()
    elif checkpoints:  # starting afresh must not overwrite the steps of a run whose `latest` is gone
        checkpoint.check_resume(checkpoints, layout["num_layers"])
    for step in range(start, steps):
        ids, begin, busy, overruns = tokens(cfg, step), time.perf_counter(), pace.busy, pace.overruns
        mine = ids[first : first + layout["samples"]]
        opt.zero_grad()
        loss = pipe.step(mine[:, :-1], mine[:, 1:])
        training.weighted_allreduce_grads(stage, layout, dist.gradient_group())
        opt.step()
        run.losses.append(training.global_loss(layout, loss))
        run.step_s.append(time.perf_counter() - begin)
        run.busy_s.append(pace.busy - busy)
        run.overruns.append(pace.overruns - overruns)
        run.ended.append(time.time())
        if checkpoints:
            checkpoint.save(checkpoints, stage, opt, layout, step, {"next_step": step + 1})
    return run


def _median(values: list[float], warmup: int) -> float:
    return statistics.median(values[warmup:] if len(values) > warmup else values)


# -- the command line ------------------------------------------------------------------------


def _positive(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= MAX_COUNT:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number from 1 to {MAX_COUNT}")
    return int(text)


MAX_COUNT = 2**31 - 1  # torch's sizes are 64-bit; far past what memory holds, and refused in one line


def _rate(text: str) -> float:
    try:
        rate = float(text)
    except ValueError:
        rate = math.nan
    if not 0 < rate < math.inf:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number")
    return rate


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=_positive, default=20)
    p.add_argument("--reference", action="store_true", help="one process over the whole global batch")
    p.add_argument("--layers", type=_positive, help="blocks (default: the layout's num_layers, else 4)")
    p.add_argument("--global-batch", type=_positive, help="samples per step (default: the layout's, else 16)")
    for name in ("vocab", "d-model", "heads", "seq"):
        p.add_argument(f"--{name}", type=_positive, default=getattr(Config, name.replace("-", "_")))
    p.add_argument("--seed", type=int, default=Config.seed)
    p.add_argument("--lr", type=_rate, default=Config.lr)
    p.add_argument("--optimizer", choices=("adam", "sgd"), default=Config.optimizer)
    p.add_argument("--dtype", choices=("float64", "float32"), default=Config.dtype)
    p.add_argument(
        "--arch",
        choices=("own", "llama"),
        default=Config.arch,
        help="this file's blocks, or transformers' Llama decoder layers (pip install transformers)",
    )
    p.add_argument("--split", choices=("layout", "even", "both"), default="layout")
    p.add_argument(
        "--schedule", choices=tuple(training.pipeline.SCHEDULES), default="1f1b", help="pipeline schedule"
    )
    p.add_argument("--slow-rank", type=int, action="append", default=[], help="a rank to slow down")
    p.add_argument("--slow-type", action="append", default=[], help="slow down the ranks of this device type")
    p.add_argument("--slow-factor", type=float, default=1.0, help="how many times slower they compute")
    p.add_argument(
        "--device-gflops",
        type=float,
        help="emulate devices of this speed (slow ranks: over --slow-factor): deterministic timing "
        "on shared or oversubscribed CPUs, set below what a rank's CPU does",
    )
    p.add_argument(
        "--flops-model",
        help="with --device-gflops: count the FLOPs of this model the planner knows [default: the "
        "layout's model if the planner knows it, else this example's]; 'own' for this example's",
    )
    p.add_argument("--flops-seq", type=int, help="the planned sequence length (default: --seq)")
    p.add_argument("--warmup", type=int, default=3, help="steps left out of the median step time")
    p.add_argument(
        "--threads", type=_positive, default=1, help="torch threads per rank (more only pay on big --d-model)"
    )
    p.add_argument("--losses-out", help="write the losses (and step times) here as JSON")
    p.add_argument(
        "--checkpoint-dir",
        default=os.environ.get(checkpoint.ENV),
        help="resume from the last checkpoint here (any layout's) and save one after every step "
        "[default: what `launch --resume DIR` exported]",
    )
    args = p.parse_args(argv)
    if args.d_model % args.heads:
        p.error(f"--d-model {args.d_model} must be a multiple of --heads {args.heads}")
    if args.reference and (unused := [n for n in LAYOUT_ONLY if getattr(args, n) != p.get_default(n)]):
        p.error(f"--reference trains one process without a layout: drop --{unused[0].replace('_', '-')}")
    writer = os.environ.get("RANK", "0") == "0"  # the only rank that writes it
    if args.losses_out is not None and writer and (problem := _unwritable(args.losses_out)):
        p.error(f"--losses-out {args.losses_out}: {problem}")  # before training, not after it
    return args


# What only a run under the launcher uses; the reference prints its losses and nothing else.
LAYOUT_ONLY = (
    "split", "schedule", "slow_rank", "slow_type", "slow_factor", "device_gflops", "flops_model",
    "flops_seq", "warmup", "checkpoint_dir",
)  # fmt: skip


def _unwritable(text: str) -> str | None:
    if not text or text.endswith("/"):
        return "name a file"
    path = _target(text)
    try:
        if path.is_symlink():  # what realpath leaves of a link loop
            return "is a loop of symbolic links; name a file"
        if path.is_dir():
            return "is a directory; name a file"
        if path.exists() and not path.is_file():  # /dev/full: the rename would replace the device
            return "is not a regular file; name a file"
        if not path.parent.is_dir():
            return f"no directory {path.parent}; create it first"
        part = _part(path)  # the very file the result goes through, not os.access: root passes it
        part.write_bytes(b"")
        part.unlink()
    except OSError as e:
        return f"cannot write there ({e.strerror}); name a file you can write"
    return None


def _target(text: str) -> Path:
    """The file --losses-out names: a symbolic link's target, which the result replaces."""
    return Path(os.path.realpath(text))


def _available_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _part(path: Path) -> Path:
    return path.with_name(f".{path.name}.part")


def _write_result(path: Path, result: dict[str, Any]) -> None:
    """Written whole or not at all: a file of an earlier run stays until this one is complete."""
    part = _part(path)
    part.write_text(json.dumps(result, indent=1), encoding="utf-8")
    try:
        part.replace(path)
    except OSError:
        part.unlink()
        raise


def make_config(args: argparse.Namespace, layout: dict[str, Any] | None) -> Config:
    """The run's config; under the launcher the layout fixes the blocks and the global batch."""
    held = (layout["layer_end"] - layout["layer_start"]) if layout else (args.layers or 4)
    # each block's attention weights and their gradients: a floor of what this rank holds
    need = held * 2 * 4 * args.d_model**2 * (8 if args.dtype == "float64" else 4)
    if (free := _available_bytes()) is not None and need > free:  # past it the kernel's OOM killer, no error
        sys.exit(
            f"train_uneven: rank {os.environ.get('RANK', '0')}: {held} blocks of --d-model {args.d_model} "
            f"need at least {need / 2**30:.3g} GiB, more than the {free / 2**30:.3g} GiB free here"
        )
    layers = args.layers if layout is None else layout["num_layers"]
    batch = args.global_batch if layout is None else layout["global_batch"]
    for flag, mine, theirs in (
        ("--layers", args.layers, layers),
        ("--global-batch", args.global_batch, batch),
    ):
        if mine is not None and mine != theirs:
            sys.exit(
                f"train_uneven: rank {os.environ.get('RANK', '0')}: {flag} {mine} but the layout has {theirs}"
            )
    return Config(
        args.vocab, args.d_model, args.heads, layers or 4, args.seq, batch or 16,
        args.seed, args.lr, args.optimizer, args.dtype, args.arch,
    )  # fmt: skip


def _report(name: str, run: Run, args: argparse.Namespace, dist: training.Distributed) -> tuple[float, int]:
    """Rank 0 prints the losses and the median step time; every rank's busy time is gathered.
    The median step and the computations of all ranks after warm-up that outlasted their emulated
    device (where there are any, the step time is the CPU's, not the emulated devices')."""
    gathered: list[Any] = [None] * dist.layout["world_size"]
    torch.distributed.all_gather_object(
        gathered, (_median(run.busy_s, args.warmup), sum(run.overruns[args.warmup :]))
    )
    prefix = "" if name == "layout" else f"{name} "
    step_s = _median(run.step_s, args.warmup)
    if dist.layout["rank"] == 0:
        for i, loss in enumerate(run.losses, run.first_step):
            print(f"{prefix}step {i} loss {loss:.10f}", flush=True)
        ranks = " ".join(f"{r}:{b:.4f}" for r, (b, _) in enumerate(gathered))
        print(f"{prefix}step_time_s {step_s:.6f} split={name} busy_s {ranks}", flush=True)
    over = sum(o for _, o in gathered)
    if over and dist.layout["rank"] == 0:
        print(f"warning: {over} computations outlasted the emulated device; lower --device-gflops")
    return step_s, over


def _summary(dist: training.Distributed, measured: dict[str, float]) -> dict[str, Any]:
    """The plan's step times next to the measured ones, and with both splits, the share of the
    predicted saving (against the even split) that was measured."""
    lay = dist.layout
    out: dict[str, Any] = {k: lay.get(k) for k in ("predicted_step_s", "even_step_s", "bound_step_s")}
    out["measured_step_s"] = measured
    if "layout" in measured and "even" in measured and lay.get("even_step_s"):
        saved = 1 - measured["layout"] / measured["even"]
        planned = 1 - lay["predicted_step_s"] / lay["even_step_s"]
        achieved = saved / planned if planned > 0 else float("nan")
        out.update(saved_measured=saved, saved_predicted=planned, achieved=achieved)
        if lay["rank"] == 0:
            print(f"saved_fraction measured={saved:.4f} predicted={planned:.4f} achieved={achieved:.3f}")
    return out


def _flops_model(args: argparse.Namespace, layout: dict[str, Any]) -> str | None:
    """The planner model whose FLOPs emulated devices run (None: this example's own)."""
    name = args.flops_model or (layout["model"] if layout["model"] in bundled_names() else "own")
    if args.device_gflops and layout["rank"] == 0:
        print(f"emulated devices: {args.device_gflops} GFLOP/s running the FLOPs of {name}", flush=True)
    return None if name == "own" else name


def _process_start() -> float | None:
    """This process's start, Unix time to a second (Linux's /proc), else None."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        stat = Path("/proc/stat").read_text().split()
        return int(stat[stat.index("btime") + 1]) + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def distributed(args: argparse.Namespace) -> dict[str, Any]:
    """Train under the launcher; rank 0's result for `--losses-out`."""
    imported = time.time()
    dist = training.init()
    times = {"process_start": _process_start(), "imported": imported, "initialized": time.time()}
    for name, reason in dist.fallbacks.items():
        print(f"rank {dist.layout['rank']}: group {name} falls back to gloo: {reason}", flush=True)
    cfg, me = make_config(args, dist.layout), dist.layout
    factor = args.slow_factor if me["rank"] in args.slow_rank or me["type"] in args.slow_type else 1.0
    model = _flops_model(args, me)
    result: dict[str, Any] = {"runs": {}}
    for name in ("layout", "even") if args.split == "both" else (args.split,):
        layout = me if name == "layout" else training.even_split(me)
        flops = stage_flops(cfg, layout, model, args.flops_seq)
        pace = Pace(factor, flops, args.device_gflops)
        run = train(cfg, dist, layout, args.steps, pace, args.schedule, args.checkpoint_dir)
        if not run.losses and me["rank"] == 0:  # a requeue after the last save: a clean finish
            print(
                f"nothing left to train: resumed at step {run.first_step} of --steps {args.steps}", flush=True
            )
        step_s, overruns = _report(name, run, args, dist) if run.losses else (None, 0)
        result["runs"][name] = {
            "losses": run.losses,
            "first_step": run.first_step,
            "step_end_unix": run.ended,
            "loaded_unix": run.loaded or None,
            "step_time_s": step_s,
            "overruns": overruns,
        }
    result["losses"] = next(iter(result["runs"].values()))["losses"]
    result["first_step"] = next(iter(result["runs"].values()))["first_step"]
    result["times"] = times  # rank 0's start: process, imports done, process groups made (Unix)
    measured = {k: v["step_time_s"] for k, v in result["runs"].items() if v["step_time_s"] is not None}
    result.update(_summary(dist, measured))
    torch.distributed.destroy_process_group()
    return result


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    rank = os.environ.get("RANK", "0")
    try:
        if args.reference:
            result: dict[str, Any] = {"losses": reference(make_config(args, None), args.steps)}
            for i, loss in enumerate(result["losses"]):
                print(f"step {i} loss {loss:.10f}", flush=True)
        else:
            result = distributed(args)
    except HeteroError as e:  # a layout or checkpoint problem: one line per rank, not a traceback
        sys.exit(f"train_uneven: rank {rank}: {e}")
    except (MemoryError, RuntimeError) as e:
        if not isinstance(e, (MemoryError, torch.cuda.OutOfMemoryError)) and "can't allocate" not in str(e):
            raise
        sys.exit(
            f"train_uneven: rank {rank}: out of memory; lower --vocab, --d-model, --seq or --global-batch"
        )
    if args.losses_out is not None and rank == "0":
        try:
            _write_result(_target(args.losses_out), result)
        except OSError as e:  # an immutable file (chattr +i) passes every check but the rename
            sys.exit(f"train_uneven: rank 0: cannot write --losses-out {args.losses_out} ({e.strerror})")


if __name__ == "__main__":
    main()
