"""Faults: a run SIGKILLed mid-epoch resumes to exactly the uninterrupted metrics; concurrent
batches on one profile do not corrupt each other; dead kernels, corrupt checkpoints, unwritable
outputs and a full disk give one clear line and no half-written files."""
import errno
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kit import batch
from kit import io as kio
from kit.config.run_config import RunConfig
from kit.train.finetune import fit
from kit.train.checkpoint_hardware import CheckpointError
from kit.runs import RunLocked, run_dir_of
from kit.train.checkpoint_hardware import describe

REPO = Path(__file__).resolve().parents[1]
KILLABLE = dict(task="synthetic", model="tiny", method="ssa-h", synthetic_size=2000, epochs=3,
                lr=5e-3)   # epochs of ~1.5 s on one core: room to kill mid-epoch


def test_sigkill_mid_epoch_then_resume_gives_the_uninterrupted_metrics(
        tmp_path, kill_at_step, comparable):
    """A real SIGKILL (nothing runs after it) three steps after the first mid-epoch checkpoint
    (every 8 steps here; 25 steps an epoch): the rerun resumes from it and ends as the
    uninterrupted run."""
    settings = {**KILLABLE, "synthetic_size": 800, "epochs": 2, "checkpoint_steps": 8}
    killed = RunConfig(**settings, outputs_dir=str(tmp_path / "killed"))
    kill_at_step(killed, 11, timeout=240)                  # inside epoch 1
    resumed = fit(killed)
    assert resumed["status"] == "ok" and resumed["resumed_inside_epoch"] is not None
    straight = fit(RunConfig(**settings, outputs_dir=str(tmp_path / "straight")))
    assert straight["resumed_after_epoch"] is None
    assert comparable(resumed) == comparable(straight)


def test_corrupt_checkpoint_is_one_clear_line(tmp_path):
    cfg = RunConfig(**{**KILLABLE, "synthetic_size": 100, "epochs": 1}, outputs_dir=str(tmp_path))
    fit(cfg)
    run = run_dir_of(cfg)
    (run / "metrics.json").unlink()                 # pretend it was killed after the checkpoint
    (run / "checkpoint" / "last" / "optimizer.bin").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError) as err:
        fit(cfg)
    assert "is corrupt" in str(err.value) and "delete" in str(err.value)
    assert "\n" not in str(err.value)


def test_a_run_held_by_another_process_is_refused(tmp_path):
    cfg = RunConfig(**{**KILLABLE, "synthetic_size": 100, "epochs": 1}, outputs_dir=str(tmp_path))
    with kio.FileLock(run_dir_of(cfg) / ".lock") as got:
        assert got
        with pytest.raises(RunLocked):
            fit(cfg)


def test_unwritable_outputs_folder(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(kio.OutputsError, match="cannot write to outputs folder .*a-file/out"):
        fit(RunConfig(**KILLABLE, outputs_dir=str(blocker / "out")))


def test_full_disk_leaves_no_partial_file(tmp_path, monkeypatch):
    target = tmp_path / "metrics.json"
    target.write_text('{"status": "ok"}')
    real_replace = os.replace

    def full(src, dst):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(kio.OutputsError, match="disk full while writing .*metrics.json"):
        kio.write_json(target, {"status": "failed"})
    monkeypatch.setattr(os, "replace", real_replace)
    assert json.loads(target.read_text()) == {"status": "ok"}     # the old file is intact
    assert list(tmp_path.iterdir()) == [target]                   # no temp file left


def test_dead_kernel_is_recorded_as_failed(tmp_path, monkeypatch):
    import papermill
    from nbclient.exceptions import DeadKernelError

    def die(*args, **kwargs):
        raise DeadKernelError("Kernel died")

    monkeypatch.setattr(papermill, "execute_notebook", die)
    profile = batch.load_profile("smoke", str(tmp_path))
    status, detail = batch.execute(profile, profile.points[0])
    assert status == "failed" and "Kernel died" in detail
    record = json.loads((run_dir_of(RunConfig.from_dict(profile.points[0])) / "metrics.json").read_text())
    assert record["status"] == "failed" and "DeadKernelError" in record["error"]


def test_two_batches_on_one_profile_at_once(tmp_path):
    """Each run is trained by one batch; the other skips it; every result is complete."""
    outputs = tmp_path / "out"
    cmd = [sys.executable, "-m", "kit.batch", "smoke", "--outputs", str(outputs), "--no-report"]
    procs = [subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for _ in range(2)]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    for point in batch.load_profile("smoke", str(outputs)).points:
        run = run_dir_of(RunConfig.from_dict(point))
        assert json.loads((run / "metrics.json").read_text())["status"] == "ok"
    assert not list(outputs.rglob("*.tmp*"))
    summaries = [o.strip().splitlines()[-1] for o in outs]
    assert all("0 failed" in s for s in summaries), summaries
    counts = [re.search(r"(\d+) ok, (\d+) skipped", s).groups() for s in summaries]
    assert sum(int(ok) for ok, _ in counts) == 4          # each config trained exactly once
    assert sum(int(skipped) for _, skipped in counts) == 4
    for notebook in outputs.rglob("notebook.ipynb"):     # the winner's notebook, whole
        assert json.loads(notebook.read_text())["cells"]
    # what a terminal / CI log shows (stdout and stderr, not a TTY): each run's progress lines
    # from inside its kernel, and none of the kernel's own log lines
    text = "\n".join(outs)
    assert "IPKernelApp" not in text and "without encryption" not in text
    assert "KeyboardInterrupt" not in text and "\r" not in text
    for line in ("epoch 1/2: dev accuracy", "epoch 2/2: dev accuracy", ": started"):
        assert text.count(line) >= 4, line                 # every run, whichever batch ran it


def test_a_checkpoint_of_another_process_count_is_refused_with_the_count(tmp_path):
    """A checkpoint from before the hardware record (progress.json without written_on): its
    RNG files, one per process, give the count."""
    cfg = RunConfig(**{**KILLABLE, "synthetic_size": 100, "epochs": 1}, outputs_dir=str(tmp_path))
    fit(cfg)
    run = run_dir_of(cfg)
    (run / "metrics.json").unlink()
    last = run / "checkpoint" / "last"
    (last / "random_states_1.pkl").write_bytes((last / "random_states_0.pkl").read_bytes())
    state = json.loads((last / "progress.json").read_text())
    here = state.pop("written_on")        # this machine's record: "fp32 on cpu x1" on this CPU
    (last / "progress.json").write_text(json.dumps(state))
    # the older checkpoint's record, as its files tell: 2 processes, no GPU name (on a GPU, the
    # count its RNG file holds)
    then = describe({"precision": here["precision"], "device": here["device"], "processes": 2,
                     **{k: here[k] for k in ("gpus",) if k in here}})
    with pytest.raises(CheckpointError, match=re.escape(
            f"written with {then}; this run has {describe(here)}: resume it on hardware like "
            "that (--processes 2)")):
        fit(cfg)
