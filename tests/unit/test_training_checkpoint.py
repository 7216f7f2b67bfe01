"""Checkpoints keyed by global layer: one layout's checkpoint resumes in another (losses equal one
uninterrupted process, float64), and bad checkpoints are one line each."""

from __future__ import annotations

import logging
import os
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
    with pytest.raises(CheckpointError, match="holds 'tiny' of 2 layers; this job's model has 3: "):
        checkpoint.load(tmp_path, stage, None, {**lay, "num_layers": 3})
    # adversarial F1: the name is not the model (`gpt2`, a path to its config): the shapes are
    assert checkpoint.load(tmp_path, stage, None, {**lay, "model": "./configs/tiny.json"})["step"] == 0
    for data in (tmp_path / "step-00000000").glob("*.distcp"):
        data.write_bytes(data.read_bytes()[:100])  # truncated
    with pytest.raises(CheckpointError, match="shard __0_0.distcp is 100 bytes, less than"):
        checkpoint.load(tmp_path, stage, None, lay)
    (tmp_path / "latest").write_text("step-00000007\n")  # names a save that never finished
    with pytest.raises(CheckpointError, match="not a complete checkpoint"):
        checkpoint.load(tmp_path, stage, None, lay)


def test_a_metadata_fifo_is_refused_not_opened(tmp_path: Path) -> None:
    """adv45 K16: DCP's open of a FIFO blocked every rank."""
    stage, lay = _stage()
    checkpoint.save(tmp_path, stage, None, lay, 0)
    (tmp_path / "step-00000000" / ".metadata").unlink()
    os.mkfifo(tmp_path / "step-00000000" / ".metadata")
    with pytest.raises(CheckpointError, match=r"step-00000000: .metadata: file is a FIFO"):
        checkpoint.load(tmp_path, stage, None, lay)


def test_unreadable_metadata_is_our_line_alone(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """adv41 96: torch logged two warnings with tracebacks before the one-line error."""
    stage, lay = _stage()
    checkpoint.save(tmp_path, stage, None, lay, 0)
    (tmp_path / "step-00000000" / ".metadata").write_bytes(b"garbage\n")
    level = logging.getLogger().level
    with pytest.raises(CheckpointError, match=r"\.metadata is unreadable \(ValueError"):
        checkpoint.load(tmp_path, stage, None, lay)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    assert logging.getLogger().level == level


def test_a_latest_link_is_replaced_not_written_through(tmp_path: Path) -> None:
    """adv38 D9: core's atomic writer follows a link; the pointer must replace it, not overwrite a
    file outside the directory. A stray `.partial` file is named when it is in the way (D10)."""
    stage, lay = _stage()
    root, outside = tmp_path / "ck", tmp_path / "outside"
    root.mkdir()
    outside.write_text("keep\n")
    (root / "latest").symlink_to(outside)
    checkpoint.save(root, stage, None, lay, 0)
    assert outside.read_text() == "keep\n" and not (root / "latest").is_symlink()
    assert checkpoint.latest(root).name == "step-00000000"
    (root / "step-00000001.partial").write_text("stray")
    with pytest.raises(CheckpointError, match=r"step-00000001\.partial: Not a directory"):
        checkpoint.save(root, stage, None, lay, 1)
    (root / "step-00000001.partial").unlink()
    (root / "step-00000001").write_text("stray")  # adv38 5.16: a repr and 'free space' advice
    with pytest.raises(
        CheckpointError, match=r"\(\S+/step-00000001: Not a directory\); .*kept: mend that or"
    ):
        checkpoint.save(root, stage, None, lay, 1)
    assert checkpoint.latest(root).name == "step-00000000"


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
    check_resume_dir(tmp_path / "ckpt", lay["num_layers"])
    check_resume_dir(tmp_path / "new", lay["num_layers"])  # a first run: made, nothing to resume yet
    assert (tmp_path / "new").is_dir()
    with pytest.raises(LaunchError, match="^--resume: .* holds 'tiny' of 2 layers; this job's model has 12"):
        check_resume_dir(tmp_path / "ckpt", 12)
    (tmp_path / "file").write_text("")
    with pytest.raises(LaunchError, match="^--resume: cannot write checkpoints in"):
        check_resume_dir(tmp_path / "file" / "ckpt", lay["num_layers"])


@pytest.mark.parametrize("kind", ["dev-zero", "fifo", "garbage", "huge"])
def test_latest_is_read_only_as_a_small_regular_file(tmp_path: Path, kind: str) -> None:
    """A `latest` linked to /dev/zero was read without limit (23 GB, OOM); a FIFO hung the launcher;
    binary garbage was a UnicodeDecodeError traceback. Each is one line now, at once."""
    from slurm_hetero.launch.run import LaunchError, check_resume_dir

    stage, lay = _stage()
    checkpoint.save(tmp_path, stage, None, lay, 0)
    pointer = tmp_path / "latest"
    pointer.unlink()
    if kind == "dev-zero":
        pointer.symlink_to("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(pointer)
    elif kind == "garbage":
        pointer.write_bytes(bytes(range(128, 256)) * 3)
    else:
        pointer.write_bytes(b"step-00000000\n" + b" " * checkpoint.MAX_LATEST_BYTES)
    reason = {
        "dev-zero": "a character device",
        "fifo": "a FIFO",
        "garbage": "not UTF-8",
        "huge": "[0-9]+ bytes, more than",
    }
    with pytest.raises(LaunchError, match=f"^--resume: .*checkpoint pointer (is )?{reason[kind]}") as e:
        check_resume_dir(tmp_path, 2)
    assert "\n" not in str(e.value)
    with pytest.raises(CheckpointError, match=reason[kind]):
        checkpoint.load(tmp_path, stage, None, lay)


def test_resuming_a_finished_run_is_a_clean_finish(tmp_path: Path) -> None:
    """A requeue after the last save resumed with no steps left: the example died on
    `statistics.median([])`, and so did every retry; it now says so in one line, exit 0."""
    saved, per_rank = tmp_path / "ckpt", layouts([0, 2], [16], micro_batch=4)
    run_ranks(tmp_path, per_rank, "--steps", "2", "--checkpoint-dir", str(saved))
    again, stdout = run_ranks(tmp_path, per_rank, "--steps", "2", "--checkpoint-dir", str(saved))
    assert again["losses"] == [] and again["first_step"] == 2
    assert "nothing left to train: resumed at step 2 of --steps 2" in stdout
    assert "Traceback" not in stdout


def _cut(path: Path, size: int | None) -> None:
    if size is None:
        path.unlink()
    else:
        path.write_bytes(path.read_bytes()[:size])


@pytest.mark.parametrize(
    "file, size, reason",
    [
        (".metadata", 0, r"\.metadata is empty"),
        (".metadata", 40, r"\.metadata is unreadable \("),
        (".metadata", None, r"\.metadata: no such file"),
        ("__0_0.distcp", 100, r"shard __0_0\.distcp is 100 bytes, less than the [0-9]+ \.metadata names"),
        ("__0_0.distcp", 0, r"shard __0_0\.distcp is 0 bytes"),
        ("__0_0.distcp", None, r"shard __0_0\.distcp: No such file"),
    ],
)
def test_launch_resume_checks_the_latest_steps_files_and_names_an_earlier_one(
    tmp_path: Path, file: str, size: int | None, reason: str
) -> None:
    """launch --resume passed a latest step whose .metadata or shard was empty, truncated or
    gone, and every rank then died in load; the advice was to throw all progress away."""
    from slurm_hetero.launch.run import LaunchError, check_resume_dir

    stage, lay = _stage()
    for step in (0, 1, 2):
        checkpoint.save(tmp_path, stage, None, lay, step)
    _cut(tmp_path / "step-00000001" / file, size)  # an earlier step broken too: not the advice
    _cut(tmp_path / "step-00000002" / file, size)
    advice = "step-00000000 is complete: write its name into .*latest to resume from it$"
    with pytest.raises(LaunchError, match=f"^--resume: .*step-00000002: {reason}.*; {advice}"):
        check_resume_dir(tmp_path, 2)


def test_a_latest_naming_no_checkpoint_names_the_newest_complete_one(tmp_path: Path) -> None:
    stage, lay = _stage()
    for step in (0, 1):
        checkpoint.save(tmp_path, stage, None, lay, step)
    (tmp_path / "latest").write_text("step-00000099\n")
    with pytest.raises(CheckpointError, match="'step-00000099', .*; step-00000001 is complete: write"):
        checkpoint.load(tmp_path, stage, None, lay)
    for step in (0, 1):
        (tmp_path / f"step-0000000{step}" / ".metadata").write_bytes(b"")
    with pytest.raises(CheckpointError, match="no complete checkpoint is left: remove .*latest to start"):
        checkpoint.load(tmp_path, stage, None, lay)


def test_complete_steps_without_latest_are_not_overwritten_by_a_fresh_start(tmp_path: Path) -> None:
    """adv40 R07/R14: a directory of complete steps whose `latest` was gone passed `launch
    --resume`, and the example started afresh, saving over those steps."""
    from slurm_hetero.launch.run import LaunchError, check_resume_dir

    saved, per_rank = tmp_path / "ckpt", layouts([0, 1, 2], [8], micro_batch=4)
    run_ranks(tmp_path, per_rank, "--steps", "2", "--checkpoint-dir", str(saved))
    (saved / "latest").unlink()
    kept = (saved / "step-00000000").stat().st_ino
    advice = "latest is missing but step-00000001 is complete: write its name into"
    with pytest.raises(LaunchError, match=advice):
        check_resume_dir(saved, 2)
    _, stdout = run_ranks(tmp_path, per_rank, "--steps", "3", "--checkpoint-dir", str(saved), code=1)
    assert stdout.strip().splitlines()[-1].startswith("train_uneven: rank 0: ") and advice in stdout
    assert (saved / "step-00000000").stat().st_ino == kept and not (saved / "latest").exists()


@pytest.mark.parametrize(
    ("broken", "says"),
    [("*.distcp", "less than the"), (".metadata", ".metadata is unreadable")],  # adv41 96: torch's tracebacks
)
def test_the_example_says_a_checkpoint_error_in_one_line_per_rank(
    tmp_path: Path, broken: str, says: str
) -> None:
    """examples/train_uneven.py, which users copy, let CheckpointError out as a traceback per rank."""
    saved, per_rank = tmp_path / "ckpt", layouts([0, 1, 2], [8], micro_batch=4)
    run_ranks(tmp_path, per_rank, "--steps", "1", "--checkpoint-dir", str(saved))
    for shard in (saved / "step-00000000").glob(broken):
        shard.write_bytes(b"garbage\n")
    _, stdout = run_ranks(tmp_path, per_rank, "--steps", "2", "--checkpoint-dir", str(saved), code=1)
    assert "Traceback" not in stdout
    assert stdout.strip().splitlines()[-1].startswith("train_uneven: rank 0: ")
    assert says in stdout


def test_a_full_disk_mid_save_removes_the_partial_step_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk mid-save left step-N.partial filling the disk and a raw torch traceback."""
    import errno

    stage, lay = _stage()
    checkpoint.save(tmp_path, stage, None, lay, 0)

    def full(state: object, storage_writer: object) -> None:
        (tmp_path / "step-00000001.partial").mkdir()
        (tmp_path / "step-00000001.partial" / "__0_0.distcp").write_bytes(b"half")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("torch.distributed.checkpoint.save", full)
    with pytest.raises(CheckpointError, match=r"cannot save step 1 in .*\(OSError: .*No space left") as e:
        checkpoint.save(tmp_path, stage, None, lay, 1)
    assert "\n" not in str(e.value)
    assert not (tmp_path / "step-00000001.partial").exists()
    assert (tmp_path / "latest").read_text().strip() == "step-00000000"

    def no_room(*args: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.undo()  # the step is saved; the pointer to it cannot be written
    monkeypatch.setattr("slurm_hetero.core.writefile.write_synced", no_room)
    with pytest.raises(CheckpointError, match=r"latest: No space left .*kept: free space there"):
        checkpoint.save(tmp_path, stage, None, lay, 1)
    assert (tmp_path / "latest").read_text().strip() == "step-00000000"


def test_a_checkpoint_exception_is_named_by_its_cause() -> None:
    from torch.distributed.checkpoint.api import CheckpointException

    error = CheckpointException("x", {0: (OSError(28, "No space left on device"), None)})
    assert checkpoint._first_line(error) == "OSError: [Errno 28] No space left on device"


def test_a_checkpoint_of_another_architecture_is_named_so(tmp_path: Path) -> None:
    """A checkpoint of the same --model and layers but another architecture was "unreadable ...
    resume from an earlier one": the advice had the user discard good checkpoints."""
    stage, lay = _stage()
    checkpoint.save(tmp_path, stage, None, lay, 0)
    wider = example.build_model(example.Config(layers=2, d_model=64))
    with pytest.raises(CheckpointError, match=r"holds another architecture of 'tiny' \(ValueError: Size mis"):
        checkpoint.load(tmp_path, wider, None, lay)
