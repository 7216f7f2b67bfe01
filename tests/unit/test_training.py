"""Uneven data and pipeline parallelism against one process: `slurm_hetero.training` and
`examples/train_uneven.py` on local gloo ranks with hand-written layout files."""

from __future__ import annotations

import importlib.util
import json
import os
import random
import re
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from slurm_hetero import training  # noqa: E402
from slurm_hetero.layout import LayoutError, RankLayout  # noqa: E402
from tests import ranks  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "train_uneven.py"
STEPS = 4


def _example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("train_uneven", EXAMPLE)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["train_uneven"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


example = _example()


@dataclass(frozen=True)
class Grid:
    """A hand-written layout: layer `bounds` per stage, `samples` per replica, `tp` copies per stage.
    Ranks go replica by replica, stage by stage (from the last if `last_stage_first`, as a launcher
    may number them), tp rank by tp rank."""

    bounds: list[int]
    samples: list[int]
    micro_batch: int
    dp_backend: str = "gloo"
    recompute: int = 0
    tp: list[int] | None = None
    last_stage_first: bool = False

    @property
    def places(self) -> dict[tuple[int, int, int], int]:
        tp = self.tp or [1] * (len(self.bounds) - 1)
        stages = range(len(tp))[:: -1 if self.last_stage_first else 1]
        where = [(r, s, t) for r in range(len(self.samples)) for s in stages for t in range(tp[s])]
        return {w: rank for rank, w in enumerate(where)}

    def group(self, name: str, keys: list[tuple[int, int, int]], backend: str = "gloo") -> dict[str, Any]:
        ranks = sorted(self.places[k] for k in keys if k in self.places)
        return {"name": name, "ranks": ranks, "backend": backend, "comm": "cpu-relay", "env": {}}

    def layout(self, replica: int, stage: int, t: int) -> dict[str, Any]:
        """One rank's file; it lists only the rank's own groups, as the launcher writes them."""
        places, stages, replicas = self.places, len(self.bounds) - 1, len(self.samples)
        n, tp = self.samples[replica], (self.tp or [1] * stages)[stage]
        return {
            "version": 1, "rank": places[replica, stage, t], "world_size": len(places),
            "local_rank": places[replica, stage, t], "local_world_size": len(places), "node": "localhost",
            "type": "cpu", "vendor": "cpu", "kind": "pipeline" if stages > 1 else "data", "model": "tiny",
            "global_batch": sum(self.samples), "num_layers": self.bounds[-1], "stage": stage,
            "num_stages": stages, "replica": replica, "num_replicas": replicas, "tp_rank": t, "tp_size": tp,
            "layer_start": self.bounds[stage], "layer_end": self.bounds[stage + 1],
            "micro_batch": self.micro_batch, "micro_batches": -(-n // self.micro_batch), "samples": n,
            "sample_offset": sum(self.samples[:replica]), "grad_weight": n / sum(self.samples),
            "recompute": self.recompute if stage == 0 else 0,
            "prev_rank": places.get((replica, stage - 1, t)),
            "next_rank": places.get((replica, stage + 1, t)),
            "groups": [
                self.group("tp", [(replica, stage, u) for u in range(tp)]),
                self.group("dp", [(r, stage, t) for r in range(replicas)], self.dp_backend),
                self.group("pp", [(replica, s, t) for s in range(stages)]),
            ],
            "predicted_step_s": 1.0, "even_step_s": 1.2, "bound_step_s": 0.9, "efficiency": 0.9,
        }  # fmt: skip


def layouts(bounds: list[int], samples: list[int], micro_batch: int, **options: Any) -> list[dict[str, Any]]:
    """Every rank's layout of a `Grid`, in rank order."""
    grid = Grid(bounds, samples, micro_batch, **options)
    return [grid.layout(*where) for where in grid.places]


def _free_port() -> int:
    """A free port below Linux's ephemeral range (32768 up): one the kernel hands out there can be
    taken by another test's gloo connections before this test's store listens on it."""
    rng = random.Random()
    while True:
        port = rng.randrange(20000, 32768)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port


def run_ranks(
    tmp_path: Path, per_rank: list[dict[str, Any]], *args: str, code: int = 0
) -> tuple[dict[str, Any], str]:
    """Run the example on one local process per layout; rank 0's --losses-out JSON and stdout
    (every rank exiting with `code`; no JSON unless 0)."""
    port, world, procs = _free_port(), len(per_rank), []
    for lay in per_rank:
        path = tmp_path / f"layout-{lay['rank']}.json"
        path.write_text(json.dumps(lay))
        env = os.environ | {
            "RANK": str(lay["rank"]), "WORLD_SIZE": str(world), "LOCAL_RANK": str(lay["rank"]),
            "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
            "SLURM_HETERO_LAYOUT": str(path),
        }  # fmt: skip
        argv = [str(EXAMPLE), "--steps", str(STEPS), "--threads", "1", *args]
        procs.append(ranks.Rank([*argv, "--losses-out", str(tmp_path / "out.json")], env))
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    for p, text in zip(procs, outputs):
        assert p.returncode == code, text
    if code:
        return {}, outputs[0]
    return json.loads((tmp_path / "out.json").read_text()), outputs[0]


def reference(per_rank: list[dict[str, Any]]) -> list[float]:
    cfg = example.Config(layers=per_rank[0]["num_layers"], global_batch=per_rank[0]["global_batch"])
    return example.reference(cfg, STEPS)


@pytest.mark.parametrize("layout", ["unset", "garbage", "directory"])
def test_the_example_says_a_layout_problem_in_one_line(tmp_path: Path, layout: str) -> None:
    """adv40 R19/R22: run outside the launcher, or on a bad layout file, the example printed the
    LayoutError as a traceback."""
    env = {k: v for k, v in os.environ.items() if k != "SLURM_HETERO_LAYOUT"}
    (tmp_path / "garbage").write_text("{not json")
    if layout != "unset":
        env["SLURM_HETERO_LAYOUT"] = str(tmp_path / "garbage" if layout == "garbage" else tmp_path)
    run = subprocess.run(
        [sys.executable, str(EXAMPLE), "--steps", "1"], env=env, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr
    assert run.stderr.count("\n") == 1 and run.stderr.startswith("train_uneven: rank 0: "), run.stderr


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--reference", "--warmup", "0"], "--reference trains one process without a layout: drop --warmup"),
        (["--reference", "--slow-factor", "2"], "drop --slow-factor"),
        (["--losses-out", "{tmp}/no/such/out.json"], "no directory {tmp}/no/such; create it first"),
        (["--losses-out", "{tmp}"], "is a directory; name a file"),
        (
            ["--losses-out", "/sys/x.json"],
            "--losses-out /sys/x.json: cannot write there (",
        ),  # adv43: root too
        (["--losses-out", "/proc/x.json"], "--losses-out /proc/x.json: cannot write there ("),  # adv44 L03
        (["--losses-out", "/dev/full"], "--losses-out /dev/full: is not a regular file"),  # adv44 L05
        (["--losses-out", ""], "--losses-out : name a file"),  # adv44 L04
        # adv45 L05d/g/h, L07
        (["--losses-out", "{tmp}/new.json/"], "name a file"),
        (["--losses-out", "{tmp}/" + "a" * 300], "cannot write there (File name too long)"),
        (["--losses-out", "{tmp}/loop"], "is a loop of symbolic links"),
        (["--losses-out", "{tmp}/dangling"], "no directory {tmp}/nodir; create it first"),
        (["--vocab", "1" + "0" * 22], "is not a whole number from 1 to 2147483647"),  # adv44 L09
    ],
)
def test_the_example_refuses_what_it_would_ignore_or_lose(tmp_path: Path, args: list[str], says: str) -> None:
    """adv42: --reference ran with launcher-only options it ignores, and an unwritable --losses-out
    failed only after training, with a traceback."""
    argv = [a.format(tmp=tmp_path) for a in args]
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    (tmp_path / "dangling").symlink_to(tmp_path / "nodir" / "x.json")
    run = subprocess.run(
        [sys.executable, str(EXAMPLE), "--steps", "1", *argv], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 2 and says.format(tmp=tmp_path) in run.stderr, run.stderr


def test_the_example_says_out_of_memory_in_one_line(tmp_path: Path) -> None:
    """adv42 52/53: a --vocab no memory holds ended in torch's allocator traceback."""
    argv = [str(EXAMPLE), "--reference", "--steps", "1", "--vocab", str(2 * 10**9), "--losses-out", "x.json"]
    run = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr
    assert (
        run.stderr
        == "train_uneven: rank 0: out of memory; lower --vocab, --d-model, --seq or --global-batch\n"
    )
    assert not (tmp_path / "x.json").exists()


def test_the_example_refuses_a_block_no_memory_holds_before_building_it(tmp_path: Path) -> None:
    """adv45 L18: --d-model 2**31-1 grew until the kernel's OOM killer ended it (137), no line."""
    argv = [str(EXAMPLE), "--reference", "--steps", "1", "--d-model", str(2**31 - 1), "--heads", "1"]
    run = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=120)
    assert run.returncode == 1 and run.stderr.startswith(
        "train_uneven: rank 0: 4 blocks of --d-model 2147483647"
    )
    assert run.stderr.count("\n") == 1, run.stderr


def test_the_example_replaces_its_losses_file_whole(tmp_path: Path) -> None:
    """Through a symbolic link (adv45 L05c) the target is replaced, the link kept."""
    out = tmp_path / "out.json"
    out.write_text("earlier")
    (tmp_path / "link.json").symlink_to(out)
    argv = [str(EXAMPLE), "--reference", "--steps", "2", "--losses-out", str(tmp_path / "link.json")]
    subprocess.run([sys.executable, *argv], check=True, capture_output=True, timeout=120)
    assert len(json.loads(out.read_text())["losses"]) == 2 and (tmp_path / "link.json").is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.json", "out.json"]


@pytest.mark.parametrize(
    "env",
    [
        {"RANK": "1"},  # adv41 109: another rank's layout
        {"RANK": "abc"},  # 111
        {"MASTER_ADDR": ""},  # 110: no rendezvous
        {"MASTER_PORT": "99999"},
        {"MASTER_ADDR": "no.such.host.invalid"},  # adv48 row 172: torch retried it to its timeout
    ],
)
def test_an_environment_that_is_not_the_layouts_rank_is_one_line(tmp_path: Path, env: dict[str, str]) -> None:
    """adv41 109-111: started by hand with another rank's variables, or none to meet at, every rank
    printed torch's traceback."""
    lay = layouts([0, 2], [8], micro_batch=4)[0]
    path = tmp_path / "layout-0.json"
    path.write_text(json.dumps(lay))
    base = {
        "RANK": "0",
        "WORLD_SIZE": str(lay["world_size"]),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29999",
    }
    full = os.environ | base | {"SLURM_HETERO_LAYOUT": str(path)} | env
    run = subprocess.run(
        [sys.executable, str(EXAMPLE), "--steps", "1"], env=full, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr
    assert run.stderr.count("\n") == 1 and "start the ranks with slurm-hetero launch" in run.stderr, (
        run.stderr
    )


@pytest.mark.parametrize(
    ("grid", "rank", "edit", "says"),
    [
        (([0, 1, 2], [8]), 1, {"global_batch": 9}, "rank 1: global_batch 9 but rank 0's is 8"),
        (
            ([0, 1, 2], [8]),
            0,
            {"micro_batches": 1000},
            "ranks 0 and 1, adjacent stages, differ in micro_batches",
        ),
        (([0, 1, 2], [8]), 0, {"next_rank": None}, "rank 0 and rank 1 disagree on being adjacent stages"),
        (([0, 1, 2], [8]), 1, {"stage": 0}, "the ranks hold stages [0] of num_stages 2"),
        (
            ([0, 1, 2, 3], [8]),
            1,
            {"layer_end": 3},
            "rank 1 (stage 1, layers to 3) names rank 2 (stage 2, layers",
        ),
        (
            ([0, 1, 2], [8]),
            1,
            {"layer_end": 1},
            "rank 1: stage 1 holds layers 1-1, but the first stage starts",
        ),
        (([0, 1, 2], [8]), 1, {"num_stages": 3}, "rank 1: num_stages 3 but rank 0's is 2"),
        (([0, 1, 2], [8], [2, 1]), 1, {"micro_batches": 5}, "the tp group [0, 1] differs in micro_batches"),
        # adv46 F39, F49: replicas of a stage on other layers; a replica twice, another missing
        (([0, 1, 2], [4, 4]), 2, {"layer_end": 2}, "the dp group [0, 2] differs in layer_end"),
        (([0, 2], [4, 4]), 1, {"replica": 0}, "the first stage holds replicas [0, 0] of num_replicas 2"),
        # adv44 E27-E29, E48, E49: groups that their members list otherwise
        (([0, 2], [4, 4]), 0, {"groups": []}, "rank 1's dp group is [0, 1] (gloo); rank 0's: none"),
        (([0, 1, 2], [8]), 1, {"groups": []}, "rank 0's pp group is [0, 1] (gloo); rank 1's: none"),
        (([0, 2], [4, 4]), 1, {"sample_offset": 3}, "[(0, 4), (3, 4)] do not cover the global batch once"),
    ],
)
def test_documents_that_do_not_fit_together_are_refused(
    grid: tuple[list[int], list[int]], rank: int, edit: dict[str, Any], says: str
) -> None:
    """adv42 56: hand-edited documents (a stage's micro_batches, a neighbour) left the ranks waiting
    on each other until torch's timeout, silently."""
    per_rank = layouts(*grid[:2], micro_batch=2, tp=grid[2] if len(grid) > 2 else None)
    training.check_agreement([training._claims(lay) for lay in per_rank])
    per_rank[rank] |= edit
    with pytest.raises(LayoutError, match=re.escape(says)):
        training.check_agreement([training._claims(lay) for lay in per_rank])


# rank 0's groups in `layouts([0, 1, 2], [8], micro_batch=2, tp=[2, 1])`
GROUPS0 = [
    {"name": name, "ranks": ranks, "backend": "gloo", "comm": "cpu-relay", "env": {}}
    for name, ranks in (("tp", [0, 1]), ("dp", [0]), ("pp", [0, 2]))
]


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        ({"tp_size": 3}, "tp_rank 0 of tp_size 3 is not its place in its tp group [0, 1]"),
        (
            {"prev_rank": 2},
            "stage 0 of 2 cannot have the neighbours prev_rank 2, next_rank 2 (its pp group: [0, 2])",
        ),
        # adv47 L29/L30: a neighbour outside the rank's pp group, or the rank itself
        ({"next_rank": 1}, "stage 0 of 2 cannot have the neighbours prev_rank None, next_rank 1 (its pp"),
        ({"next_rank": 0}, "stage 0 of 2 cannot have the neighbours prev_rank None, next_rank 0 (its pp"),
        # adv47 L32/L36/L38: a repeated rank passed the size checks; L34/L15: a second tp group
        (
            {"groups": [*GROUPS0[:1], {**GROUPS0[1], "ranks": [0, 0]}, GROUPS0[2]]},
            "group 'dp' ranks [0, 0] must be sorted, each rank once",
        ),
        # adv48 rows 137/169: unsorted ranks; 136/168: a group of another name
        (
            {"groups": [{**GROUPS0[0], "ranks": [1, 0]}, *GROUPS0[1:]]},
            "group 'tp' ranks [1, 0] must be sorted, each rank once",
        ),
        (
            {"groups": [*GROUPS0, GROUPS0[0]]},
            "groups ['tp', 'dp', 'pp', 'tp']: a rank is in one group of each of tp, pp, dp, dp_local",
        ),
        (
            {"groups": [*GROUPS0, {**GROUPS0[0], "name": "xx"}]},
            "groups ['tp', 'dp', 'pp', 'xx']: a rank is in",
        ),
        # adv45 F04: without the dp group the replicas trained apart
        (
            {"num_replicas": 2},
            "num_replicas 2 but its dp group is [0]: the replicas would not average gradients",
        ),
        # adv49 132-134: a dp_local group outside the dp group, or a group without a backend
        (
            {"groups": [*GROUPS0, {**GROUPS0[1], "name": "dp_local", "ranks": [0, 2]}]},
            "dp_local group [0, 2] is not within its dp group [0]",
        ),
        (
            {"groups": [{**GROUPS0[0], "backend": ""}, *GROUPS0[1:]]},
            "each group needs name, ranks, backend and comm (non-empty text) and env; got",
        ),
        (  # adv52 L23/L24
            {"groups": [*GROUPS0[:2], {**GROUPS0[2], "comm": "  "}]},
            "each group needs name, ranks, backend and comm (non-empty text) and env; got",
        ),
        # adv46 F06: a rank without its tp group ended in StopIteration and gloo tracebacks
        (
            {"groups": [{"name": "xx", "ranks": [0, 1], "backend": "gloo", "comm": "ccl", "env": {}}]},
            "no tp group: every rank is in a tp, a pp and a dp group (one rank each at least)",
        ),
    ],
)
def test_a_document_at_odds_with_itself_is_named(edit: dict[str, Any], says: str) -> None:
    lay = layouts([0, 1, 2], [8], micro_batch=2, tp=[2, 1])[0]
    assert lay["groups"] == GROUPS0
    RankLayout.from_dict(lay)
    with pytest.raises(LayoutError, match=f"^layout: {re.escape(says)}"):
        RankLayout.from_dict(lay | edit)


@pytest.mark.parametrize(
    ("rank", "edit", "says"),
    [
        (
            0,
            {"micro_batch": 2, "micro_batches": 4},
            "rank {r}: ranks 0 and 1, adjacent stages, differ in micro_batch",
        ),
        # adv44 E32: a problem one document has alone stopped its rank; the others waited for it
        (1, {"grad_weight": 0.5}, "rank {r}: rank 1: {path}: grad_weight must be samples / global_batch"),
        (1, {"world_size": 4}, "rank {r}: rank 1: world_size 4 but WORLD_SIZE is 2"),
    ],
)
def test_a_document_problem_stops_every_rank_in_one_line(
    tmp_path: Path, rank: int, edit: dict[str, Any], says: str
) -> None:
    per_rank = layouts([0, 1, 2], [8], micro_batch=4)
    per_rank[rank] |= edit
    _, stdout = run_ranks(tmp_path, per_rank, code=1)
    path = tmp_path / "layout-1.json"
    assert stdout.strip().splitlines()[-1].startswith(f"train_uneven: {says.format(r=0, path=path)}"), stdout


def test_uneven_data_parallel_matches_one_process(tmp_path: Path) -> None:
    per_rank = layouts([0, 2], [5, 11], micro_batch=4, dp_backend="hccl")
    result, stdout = run_ranks(tmp_path, per_rank)
    assert result["losses"] == pytest.approx(reference(per_rank), abs=1e-9)
    assert "group dp falls back to gloo" in stdout  # no Ascend here: logged, not silent


def test_uneven_pipeline_matches_one_process(tmp_path: Path) -> None:
    # stage 1 is sharded over two tp ranks (DTensor): rank 2 has no neighbour and follows rank 1
    per_rank = layouts([0, 1, 4], [16], micro_batch=6, tp=[1, 2])
    assert per_rank[2]["prev_rank"] is None
    result, stdout = run_ranks(tmp_path, per_rank, "--split", "both")
    assert result["runs"]["layout"]["losses"] == pytest.approx(reference(per_rank), abs=1e-9)
    assert result["runs"]["even"]["losses"] == pytest.approx(reference(per_rank), abs=1e-9)
    assert "saved_fraction measured=" in stdout


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_pipeline_by_data_parallel_matches_one_process(tmp_path: Path, schedule: str) -> None:
    per_rank = layouts([0, 1, 3], [7, 9], micro_batch=3, recompute=1)
    result, _ = run_ranks(
        tmp_path, per_rank, "--slow-rank", "1", "--slow-factor", "2", "--schedule", schedule
    )
    assert result["losses"] == pytest.approx(reference(per_rank), abs=1e-9)
    assert result["losses"][-1] < result["losses"][0]


def test_fewer_micro_batches_than_stages_run_under_the_default_schedule(tmp_path: Path) -> None:
    # the planner gives a replica 1 micro-batch on 2 stages (tiny-lm, gb 8, a100 + l40s): torch's
    # Schedule1F1B refused it at the first step; its order then is GPipe's, which runs it
    per_rank = layouts([0, 1, 3], [8], micro_batch=8)
    assert per_rank[0]["micro_batches"] == 1 < per_rank[0]["num_stages"]
    result, _ = run_ranks(tmp_path, per_rank, "--schedule", "1f1b")
    assert result["losses"] == pytest.approx(reference(per_rank), abs=1e-9)


@pytest.mark.parametrize("rows", [4, 6])
def test_pipeline_inputs_are_contiguous_whatever_the_callers_slice(rows: int) -> None:
    # the example feeds ids[:, :-1] (stride 17 on 16 columns): torch 2.6's PipelineStage refused it
    # with a stride mismatch (expected (16, 1), actual (17, 1)) when no row was padded
    from slurm_hetero.training.pipeline import _pad

    ids = torch.arange(4 * 17).reshape(4, 17)
    padded = _pad(ids[:, :-1], rows)
    assert padded.shape == (rows, 16) and padded.stride() == (16, 1) and padded.is_contiguous()
    assert torch.equal(padded[:4], ids[:, :-1])


def test_the_last_stages_output_is_detachable_in_place() -> None:
    # torch 2.6's PipelineStage detaches the last stage's output in place: a view (nn.Linear on
    # 3-d input) raised "Can't detach views in-place" at the first backward
    from slurm_hetero.training.pipeline import _Owned

    head = torch.nn.Linear(4, 3)
    x = torch.randn(2, 5, 4)
    assert head(x)._is_view()
    out = _Owned(head)(x)
    assert not out._is_view()
    out.sum().backward()
    assert head.weight.grad is not None and torch.equal(
        head.weight.grad, x.reshape(-1, 4).sum(0).expand(3, 4)
    )
    out.detach_()


def test_tensor_parallel_replicas_of_uneven_shares_match_one_process(tmp_path: Path) -> None:
    per_rank = layouts([0, 4], [5, 11], micro_batch=4, tp=[2])
    result, _ = run_ranks(tmp_path, per_rank)
    assert result["losses"] == pytest.approx(reference(per_rank), abs=1e-9)


def test_a_transformers_llama_in_pipeline_and_tensor_parallel_matches_one_process(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    per_rank = layouts([0, 1, 4], [16], micro_batch=6, tp=[1, 2])
    result, _ = run_ranks(tmp_path, per_rank, "--arch", "llama")
    cfg = example.Config(layers=4, global_batch=16, arch="llama")
    assert result["losses"] == pytest.approx(example.reference(cfg, STEPS), abs=1e-9)


def test_a_stage_the_tensor_parallel_plan_does_not_name_is_refused_not_run_whole() -> None:
    with pytest.raises(ValueError, match="no submodule matches the tensor-parallel plan"):
        training.parallelize(torch.nn.Sequential(torch.nn.Linear(2, 2)), object())  # type: ignore[arg-type]
    assert training.parallelize(example.Block(example.Config()), None) is not None  # tp 1: left whole


# Two tp ranks shard one block of each architecture and count the group's all-reduces of one
# forward and one backward (torch's profiler names each c10d::allreduce_).
ALLREDUCE_RANK = """
import json, sys, torch, torch.distributed as dist
sys.path.insert(0, sys.argv[2])
import train_uneven as ex
from slurm_hetero import training
dist.init_process_group("gloo")
group, out = dist.new_group([0, 1]), {}
for arch in ("own", "llama"):
    model = ex.build_model(ex.Config(layers=1, arch=arch))
    block = training.parallelize(model[1], group)
    x = torch.randn(2, 16, 32, dtype=torch.float64, requires_grad=True)
    with torch.profiler.profile() as forward:
        y = block(x)
    with torch.profiler.profile() as backward:
        y.sum().backward()
    out[arch] = [sum(e.count for e in p.key_averages() if e.key == "c10d::allreduce_")
                 for p in (forward, backward)]
json.dump(out, open(sys.argv[1], "w"))
"""


def test_a_tensor_parallel_block_all_reduces_twice_each_way_as_planned(tmp_path: Path) -> None:
    """Megatron's two all-reduces per block forward and two backward, what the planner prices
    (`engine.stagecost`): the column-parallel projections of one input share one backward
    all-reduce, in this example's blocks and in transformers' Llama layers."""
    pytest.importorskip("transformers")
    port, procs = _free_port(), []
    for rank in (0, 1):
        env = os.environ | {
            "RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
        }  # fmt: skip
        argv = ["-c", ALLREDUCE_RANK, str(tmp_path / f"out-{rank}.json"), str(EXAMPLE.parent)]
        procs.append(ranks.Rank(argv, env))
    for proc in procs:
        text = proc.communicate(timeout=120)[0]
        assert proc.returncode == 0, text
    for rank in (0, 1):
        assert json.loads((tmp_path / f"out-{rank}.json").read_text()) == {"own": [2, 2], "llama": [2, 2]}


# Each rank's gradients (22 elements: divisible by neither vendor's size nor their lcm, 6) are
# seeded by its rank; it reduces them hierarchically and through the flat dp group.
HIERARCHY_RANK = """
import json, os, sys, torch
from slurm_hetero import training
dist = training.init()
def module():
    m = torch.nn.Module()
    m.a = torch.nn.Parameter(torch.zeros(7, dtype=torch.float64))
    m.b = torch.nn.Parameter(torch.zeros(3, 5, dtype=torch.float64))
    for p in m.parameters():
        p.grad = torch.randn(p.shape, dtype=torch.float64, generator=gen)
    return m
out = {}
for name, group in (("hierarchical", dist.gradient_group()), ("flat", dist.group("dp"))):
    gen = torch.Generator().manual_seed(dist.layout["rank"])
    m = module()
    training.weighted_allreduce_grads(m, dist.layout, group)
    out[name] = [x for p in m.parameters() for x in p.grad.reshape(-1).tolist()]
h = dist.hierarchical
out["pieces"] = None if h is None else [list(p.owners) for p in h.pieces]
out["fallbacks"] = dist.fallbacks
json.dump(out, open(sys.argv[1], "w"))
"""


@pytest.mark.parametrize(
    ("vendors", "pieces"),
    [
        ("aaabb", [[0, 3], [1, 3], [1, 4], [2, 4]]),  # edges at 0, 1/3, 1/2, 2/3, 1
        ("abb", [[0, 1], [0, 2]]),  # a vendor of one rank: no group of its own
    ],
)
def test_hierarchical_gradient_sum_across_vendors_equals_the_flat_one(
    tmp_path: Path, vendors: str, pieces: list[list[int]]
) -> None:
    """Two vendors of uneven sizes (3 and 2 data-parallel ranks; 1 and 2) with uneven samples:
    reduce-scatter inside each vendor, all-reduce of each piece among its owners, all-gather, on a
    tensor whose length no size divides, gives the flat weighted sum (and the sum of the seeded
    gradients)."""
    samples = [5, 11, 3, 8, 6][: len(vendors)]
    per_rank = layouts([0, 2], samples, micro_batch=4)
    for lay, vendor in zip(per_rank, vendors):
        local = [r for r, v in enumerate(vendors) if v == vendor]
        backend = "hccl" if vendor == "b" else "gloo"  # no Ascend here: falls back to gloo, logged
        lay["vendor"] = vendor
        lay["groups"].append(
            {"name": "dp_local", "ranks": local, "backend": backend, "comm": "vendor-ccl", "env": {}}
        )
    port, procs, world = _free_port(), [], str(len(vendors))
    for lay in per_rank:
        path = tmp_path / f"layout-{lay['rank']}.json"
        path.write_text(json.dumps(lay))
        env = os.environ | {
            "RANK": str(lay["rank"]), "WORLD_SIZE": world, "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port), "SLURM_HETERO_LAYOUT": str(path),
        }  # fmt: skip
        procs.append(ranks.Rank(["-c", HIERARCHY_RANK, str(tmp_path / f"out-{lay['rank']}.json")], env))
    for p in procs:
        text = p.communicate(timeout=120)[0]
        assert p.returncode == 0, text
    results = [json.loads((tmp_path / f"out-{r}.json").read_text()) for r in range(len(vendors))]
    expected = torch.zeros(22, dtype=torch.float64)
    for rank, n in enumerate(samples):
        gen = torch.Generator().manual_seed(rank)
        grads = [torch.randn(shape, dtype=torch.float64, generator=gen) for shape in ((7,), (3, 5))]
        expected += torch.cat([g.reshape(-1) for g in grads]) * n / sum(samples)
    for r in results:
        assert r["pieces"] == pieces
        assert r["hierarchical"] == pytest.approx(r["flat"], rel=1e-12, abs=1e-12)
        assert r["hierarchical"] == pytest.approx(expected.tolist(), rel=1e-12, abs=1e-12)
    assert all("dp_local" in r["fallbacks"] for r, v in zip(results, vendors) if v == "b")


def test_shard_pieces_split_at_every_vendors_shard_edge() -> None:
    assert training.shard_pieces([3, 2]) == (
        6,
        [(0, 2, (0, 0)), (2, 3, (1, 0)), (3, 4, (1, 1)), (4, 6, (2, 1))],
    )
    assert training.shard_pieces([4, 4]) == (4, [(i, i + 1, (i, i)) for i in range(4)])


# -- in one process --------------------------------------------------------------------------


def _replica_grads(model: Any, ids: Any, lay: dict[str, Any]) -> list[Any]:
    """One replica's gradient (mean over its samples), passed through the weighting."""
    model.zero_grad()
    part = ids[lay["sample_offset"] : lay["sample_offset"] + lay["samples"]]
    example.lm_loss(model(part[:, :-1]), part[:, 1:]).backward()
    training.weighted_allreduce_grads(model, lay, None)  # no group: scales by grad_weight only
    return [p.grad.clone() for p in model.parameters()]


def test_weighting_gives_the_global_gradient_and_an_unweighted_average_does_not() -> None:
    cfg = example.Config(layers=2, global_batch=16)
    model, ids = example.build_model(cfg), example.tokens(cfg, 0)
    example.lm_loss(model(ids[:, :-1]), ids[:, 1:]).backward()
    full = [p.grad.clone() for p in model.parameters()]
    per_rank = layouts([0, 2], [5, 11], micro_batch=16)
    summed = [a + b for a, b in zip(*(_replica_grads(model, ids, lay) for lay in per_rank))]
    own = [_replica_grads(model, ids, lay | {"grad_weight": 1.0}) for lay in per_rank]
    unweighted = [(a + b) / 2 for a, b in zip(*own)]
    assert all(torch.allclose(s, f, atol=1e-12) for s, f in zip(summed, full))
    assert max(float((u - f).abs().max()) for u, f in zip(unweighted, full)) > 1e-3


def test_stage_modules_slices_blocks_with_embedding_first_and_head_last() -> None:
    model = example.build_model(example.Config(layers=4))
    first, last = layouts([0, 1, 4], [16], micro_batch=6, recompute=1)
    head_stage = training.stage_modules(model, last)
    assert [type(m).__name__ for m in head_stage] == ["Block"] * 3 + ["Head"]
    assert head_stage[0] is model[2] and head_stage[-1] is model[-1]
    assert [type(m).__name__ for m in training.stage_modules(model, first)] == ["Embed", "Recompute"]
    with pytest.raises(LayoutError, match="the model has 4 blocks, the layout 3"):
        training.stage_modules(model, layouts([0, 1, 3], [16], micro_batch=6)[0])
    no_model = {
        **first,
        "num_layers": 0,
        "layer_start": 0,
        "layer_end": 0,
    }  # adv41 112: launch without --model
    with pytest.raises(LayoutError, match="the layout plans no model"):
        training.stage_modules(model, no_model)


def test_micro_batches_end_with_the_rest() -> None:
    lay = layouts([0, 2], [5, 11], micro_batch=4)[1]
    assert training.micro_batch_sizes(lay) == [4, 4, 3]
    with pytest.raises(ValueError, match="11 samples do not make 2 micro-batches"):
        training.micro_batch_sizes(lay | {"micro_batches": 2})


def test_even_split_has_equal_layers_and_samples() -> None:
    lays = [training.even_split(x) for x in layouts([0, 1, 3], [7, 9], micro_batch=3)]
    assert [(x["layer_start"], x["layer_end"]) for x in lays] == [(0, 2), (2, 3)] * 2
    assert [(x["samples"], x["sample_offset"], x["grad_weight"]) for x in lays[::2]] == [
        (8, 0, 0.5),
        (8, 8, 0.5),
    ]


@pytest.mark.parametrize("built", [True, False])
def test_a_torch_without_libuv_gets_use_libuv_0(monkeypatch: pytest.MonkeyPatch, built: bool) -> None:
    # the 24.11 dev cluster's torch 2.6 lacks libuv: every rank failed at init without USE_LIBUV=0
    import torch.distributed as dist

    real = dist.TCPStore

    def store(*args: Any, **kwargs: Any) -> Any:
        if not built and kwargs.get("use_libuv"):
            raise RuntimeError("use_libuv was requested but PyTorch was build without libuv support")
        return real(*args, **kwargs)

    monkeypatch.delenv("USE_LIBUV", raising=False)
    monkeypatch.setattr(dist, "TCPStore", store)
    training._use_libuv_if_built()
    assert os.environ.get("USE_LIBUV") == (None if built else "0")
    monkeypatch.setenv("USE_LIBUV", "1")  # the user's own choice is kept
    training._use_libuv_if_built()
    assert os.environ["USE_LIBUV"] == "1"


def test_backend_availability_names_what_is_missing() -> None:
    assert training.backend_unavailable_reason("gloo") is None
    assert "no 'nosuchccl' backend" in (training.backend_unavailable_reason("nosuchccl") or "")
    # the plugin named is the rank's vendor's: an NVIDIA rank on a CPU torch is not told of
    # Kunlunxin's torch_xmlir, a Kunlunxin rank is
    if not torch.distributed.is_backend_available("nccl"):
        assert training.backend_unavailable_reason("nccl", "nvidia") == "this torch has no 'nccl' backend"
        assert "import torch_xmlir" in (training.backend_unavailable_reason("nccl", "kunlunxin") or "")
    assert "import torch_npu" in (training.backend_unavailable_reason("hccl", "ascend") or "")


def test_package_imports_without_torch() -> None:
    code = "import sys; sys.modules['torch'] = None; import slurm_hetero.training"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)
