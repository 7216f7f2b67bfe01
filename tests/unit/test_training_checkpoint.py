"""Checkpoints keyed by global layer: one layout's checkpoint resumes in another (losses equal one
uninterrupted process, float64), and bad checkpoints are one line each."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from slurm_hetero.training import checkpoint  # noqa: E402
from slurm_hetero.training.checkpoint import CheckpointError  # noqa: E402
from tests.unit.test_training import example, layouts, reference, run_ranks  # noqa: E402


def test_a_pipeline_checkpoint_resumes_as_tensor_parallel_data_replicas(tmp_path: Path) -> None:
    saved = tmp_path / "ckpt"
    first = layouts([0, 1, 4], [16], micro_batch=6, tp=[1, 2], recompute=1)
    before, _ = run_ranks(tmp_path, first, "--steps", "2", "--checkpoint-dir", str(saved))
    then = layouts([0, 4], [5, 11], micro_batch=4, tp=[2])
    after, _ = run_ranks(tmp_path, then, "--steps", "4", "--checkpoint-dir", str(saved))
    whole = reference(first)
    assert before["losses"] == pytest.approx(whole[:2], abs=1e-9)
    assert after["first_step"] == 2 and after["losses"] == pytest.approx(whole[2:], abs=1e-9)
    assert (saved / "latest").read_text().strip() == "step-00000003"


def test_a_stage_resumes_on_layers_no_saving_rank_held_with_the_saved_hyperparameters(
    tmp_path: Path,
) -> None:
    """The file keeps one rank's optimizer param_groups: a re-split stage whose layers that rank did
    not hold still gets the hyperparameters (Adam's betas) and its own parameters."""
    saved = tmp_path / "ckpt"
    first = layouts([0, 1, 2, 4], [12], micro_batch=3)
    run_ranks(tmp_path, first, "--steps", "2", "--checkpoint-dir", str(saved))
    then = layouts([0, 1, 4], [12], micro_batch=3, last_stage_first=True)
    after, _ = run_ranks(tmp_path, then, "--steps", "4", "--checkpoint-dir", str(saved))
    assert after["first_step"] == 2 and after["losses"] == pytest.approx(reference(first)[2:], abs=1e-9)


def _stage(layers: int = 2) -> tuple[torch.nn.Module, dict[str, object]]:
    cfg = example.Config(layers=layers)
    lay = layouts([0, layers], [16], micro_batch=4)[0]
    stage = example.build_model(cfg)
    return stage, lay


def test_names_are_global_layers_whatever_the_stage() -> None:
    lay = {"stage": 1, "layer_start": 3, "layer_end": 5}
    assert checkpoint.global_name("0.inner.mlp.up_proj.weight", lay) == "layers.3.mlp.up_proj.weight"
    assert checkpoint.global_name("2.out.bias", lay) == "head.out.bias"
    assert (
        checkpoint.global_name("0.tokens.weight", {**lay, "stage": 0, "layer_start": 0})
        == "embed.tokens.weight"
    )


def test_bad_checkpoints_are_one_line_each(tmp_path: Path) -> None:
    stage, lay = _stage()
    with pytest.raises(CheckpointError, match="no checkpoint"):
        checkpoint.load(tmp_path, stage, None, lay)
    checkpoint.save(tmp_path, stage, None, lay, 0)
    with pytest.raises(CheckpointError, match="holds 'tiny' of 2 layers; this job trains 'other'"):
        checkpoint.load(tmp_path, stage, None, {**lay, "model": "other"})
    for data in (tmp_path / "step-00000000").glob("*.distcp"):
        data.write_bytes(data.read_bytes()[:100])  # truncated
    with pytest.raises(CheckpointError, match="unreadable checkpoint"):
        checkpoint.load(tmp_path, stage, None, lay)
    (tmp_path / "latest").write_text("step-00000007\n")  # names a save that never finished
    with pytest.raises(CheckpointError, match="not a complete checkpoint"):
        checkpoint.load(tmp_path, stage, None, lay)


def test_an_unwritable_directory_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    stage, lay = _stage()
    blocked = tmp_path / "file"
    blocked.write_text("")
    with pytest.raises(CheckpointError, match="cannot write checkpoints in"):
        checkpoint.save(blocked / "ckpt", stage, None, lay, 0)


def test_a_crash_mid_save_leaves_the_previous_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stage, lay = _stage()
    checkpoint.save(tmp_path, stage, None, lay, 0)
    before = {k: v.clone() for k, v in stage.state_dict().items()}

    def crash(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr("torch.distributed.checkpoint.save", crash)
    with torch.no_grad():
        for p in stage.parameters():
            p.add_(1.0)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save(tmp_path, stage, None, lay, 1)
    monkeypatch.undo()
    assert checkpoint.load(tmp_path, stage, None, lay)["step"] == 0
    assert all(torch.equal(before[k], v) for k, v in stage.state_dict().items())


def test_launch_resume_checks_the_directory_in_one_line(tmp_path: Path) -> None:
    from slurm_hetero.launch.run import LaunchError, check_resume_dir

    stage, lay = _stage()
    checkpoint.save(tmp_path / "ckpt", stage, None, lay, 0)
    check_resume_dir(tmp_path / "ckpt", "tiny")
    check_resume_dir(tmp_path / "new", "tiny")  # a first run: made, nothing to resume yet
    assert (tmp_path / "new").is_dir()
    with pytest.raises(
        LaunchError, match="^--resume: .* holds a checkpoint of 'tiny'; this job trains 'gpt2'"
    ):
        check_resume_dir(tmp_path / "ckpt", "gpt2")
    (tmp_path / "file").write_text("")
    with pytest.raises(LaunchError, match="^--resume: cannot write checkpoints in"):
        check_resume_dir(tmp_path / "file" / "ckpt", "tiny")
