"""Cluster faults, in one process with the tiny model: a run that keeps no checkpoint still
resumes after a signal (no requeue loop); a signal inside SSA label generation, evaluation or
test prediction stops the pass between two batches and the rerun ends as the uninterrupted
run; a checkpoint of other hardware is refused in one line or resumed with a note; an RNG that
accelerate failed to restore is an error; the epoch's last short gradient accumulation; fsync
before every rename; stale temporary folders; threads from the job's CPUs."""
import json
import os
import re
import signal
from pathlib import Path
from types import SimpleNamespace
from typing import NamedTuple

import pandas as pd
import pytest
import torch

from kit import io as kio
from kit.config.run_config import RunConfig
from kit.runs import RunPreempted, checkpoint_dir, read_metrics, run_dir_of
from kit.train import accel, loop
from kit.train import checkpoint_hardware as khw
from kit.train import step as kstep
from kit.train.finetune import fit
from kit.train.checkpoint_hardware import CheckpointError

REPO = Path(__file__).resolve().parents[1]
TINY = dict(task="synthetic", model="tiny", method="bert", synthetic_size=96, lr=5e-3,
            batch_size=16, epochs=2, report_to=("none",))

pytestmark = pytest.mark.usefixtures("one_thread")      # conftest.py


class Killed(BaseException):
    """Stands in for SIGKILL: nothing of the run runs after it."""


def dies_at_step(monkeypatch, at: int) -> None:
    """The loop's `at`-th training step (1-based) never returns, as under SIGKILL."""
    calls, step = [], loop.train_step

    def wrapped(*args, **kwargs):
        calls.append(1)
        if len(calls) == at:
            raise Killed
        return step(*args, **kwargs)
    monkeypatch.setattr(loop, "train_step", wrapped)


def signal_inside_pass(monkeypatch, which: str, after: int, signum=signal.SIGUSR1,
                       rows: int | None = None) -> list:
    """The process signals itself during batch `after` of the first inference pass whose
    progress label holds `which` ("eval", "label generation") and, if given, that predicts
    `rows` rows, as a scheduler's signal would land; returns how many batches each such pass
    ran (a pass that heeds the signal stops after batch `after`)."""
    real_pass, real_collate, ran = loop.predict_logits, kstep.collate, []
    watching = []

    def collate(*args, **kwargs):
        if watching:
            ran[-1] += 1
            if len(ran) == 1 and ran[-1] == after:
                os.kill(os.getpid(), signum)
        return real_collate(*args, **kwargs)

    def predict(model, examples, *args, **kwargs):
        desc = args[3] if len(args) > 3 else kwargs.get("desc", "eval")
        if which in desc and rows in (None, len(examples)):
            ran.append(0)
            watching.append(1)
        try:
            return real_pass(model, examples, *args, **kwargs)
        finally:
            watching.clear()
    monkeypatch.setattr(kstep, "collate", collate)
    monkeypatch.setattr(loop, "predict_logits", predict)
    return ran


def weights(cfg: RunConfig) -> bytes:
    return (checkpoint_dir(run_dir_of(cfg)) / "best" / "model.safetensors").read_bytes()


def history(cfg: RunConfig) -> pd.DataFrame:
    return pd.read_csv(run_dir_of(cfg) / "history.csv").drop(columns="wall_s")


# ---------------------------------------------------------------- 1. no requeue loop

def test_a_run_without_save_checkpoints_resumes_after_a_signal_and_keeps_no_checkpoint(
        tmp_path, monkeypatch, comparable):
    """save_checkpoints: false used to stop with no checkpoint; the job script requeued it and
    it started again from zero, forever. Now it resumes where it stopped, and checkpoint/ goes
    once the run is recorded ok."""
    settings = {**TINY, "save_checkpoints": False}
    straight_cfg = RunConfig(**settings, outputs_dir=str(tmp_path / "straight"))
    straight = fit(straight_cfg)
    assert not checkpoint_dir(run_dir_of(straight_cfg)).exists()
    calls, step = [], loop.train_step

    def signalled(*args, **kwargs):
        calls.append(1)
        if len(calls) == 9:                       # batch 3 of epoch 2 (6 batches an epoch)
            os.kill(os.getpid(), signal.SIGUSR1)
        return step(*args, **kwargs)
    monkeypatch.setattr(loop, "train_step", signalled)
    cfg = RunConfig(**settings, outputs_dir=str(tmp_path / "stopped"))
    with pytest.raises(RunPreempted):
        fit(cfg)
    stopped = read_metrics(run_dir_of(cfg))["preempted"]
    assert (stopped["epoch"], stopped["batch"], stopped["during"]) == (2, 3, "training")
    assert stopped["checkpoint"] == str(checkpoint_dir(run_dir_of(cfg)) / "last")
    resumed = fit(cfg)
    assert resumed["resumed_inside_epoch"] == {"epoch": 1, "position": 3}
    assert comparable(resumed) == comparable(straight)
    assert history(cfg).equals(history(straight_cfg))
    assert not checkpoint_dir(run_dir_of(cfg)).exists()


# ---------------------------------------------------------------- 2. stops inside a pass

class Stopped(NamedTuple):
    straight_cfg: RunConfig     # the run without a signal
    straight: dict              # its metrics
    cfg: RunConfig              # the run the signal stopped
    ran: list                   # the batches each watched pass ran
    record: dict                # metrics.json's "preempted"


def stopped_inside_pass(tmp_path, monkeypatch, settings: dict, which: str, after: int,
                        **signalled) -> Stopped:
    """The run of `settings` straight (in tmp_path/straight), then again (tmp_path/stopped) with
    a signal during batch `after` of the pass `which` (signal_inside_pass, `signalled` passed
    on), which must end it as preempted; the signal's patch undone."""
    straight_cfg = RunConfig(**settings, outputs_dir=str(tmp_path / "straight"))
    straight = fit(straight_cfg)
    ran = signal_inside_pass(monkeypatch, which, after, **signalled)
    cfg = RunConfig(**settings, outputs_dir=str(tmp_path / "stopped"))
    with pytest.raises(RunPreempted):
        fit(cfg)
    monkeypatch.undo()
    return Stopped(straight_cfg, straight, cfg, ran, read_metrics(run_dir_of(cfg))["preempted"])


def test_a_signal_during_evaluation_stops_within_the_pass_and_the_rerun_evaluates_again(
        tmp_path, monkeypatch, comparable):
    settings = {**TINY, "eval_batch_size": 8}           # 24 dev rows: 3 batches
    straight_cfg, straight, cfg, ran, stopped = stopped_inside_pass(
        tmp_path, monkeypatch, settings, "eval", after=2)
    assert ran == [2]                         # 2 batches of 3, then the stop
    assert (stopped["epoch"], stopped["batch"], stopped["during"]) == (1, 6, "evaluation")
    assert stopped["checkpoint"] is not None
    resumed = fit(cfg)
    assert resumed["resumed_inside_epoch"] == {"epoch": 0, "position": 6}
    assert comparable(resumed) == comparable(straight)
    assert history(cfg).equals(history(straight_cfg))
    assert weights(cfg) == weights(straight_cfg)


def test_a_signal_during_ssa_label_generation_stops_within_the_pass_and_the_labels_are_drawn_again(
        tmp_path, monkeypatch, comparable):
    settings = {**TINY, "method": "ssa-h", "eval_batch_size": 16}   # 96 rows probed: 6 batches
    straight_cfg, straight, cfg, ran, stopped = stopped_inside_pass(
        tmp_path, monkeypatch, settings, "label generation", after=3, signum=signal.SIGTERM)
    assert ran == [3]                         # 3 batches of 6, then the stop
    assert (stopped["epoch"], stopped["batch"], stopped["during"]) == (2, 0, "label generation")
    assert stopped["signal"] == "SIGTERM" and stopped["checkpoint"] is not None
    resumed = fit(cfg)
    assert resumed["resumed_after_epoch"] == 0 and resumed["resumed_inside_epoch"] is None
    assert comparable(resumed) == comparable(straight)           # the SSA label stats too
    assert weights(cfg) == weights(straight_cfg)


def test_a_signal_during_test_prediction_of_a_run_without_checkpoints_resumes_to_the_same_file(
        tmp_path, monkeypatch):
    """A Kaggle-style run (csv_test_path) without save_checkpoints predicts the test with its
    best epoch's weights: kept on disk while it runs, so the rerun after a stop in the test pass
    predicts with the same weights."""
    pairs = pd.read_csv(REPO / "tests" / "fixtures" / "stsb_pairs.csv")
    test = tmp_path / "test.csv"
    pairs.drop(columns="score").iloc[:30].to_csv(test, index=False)
    settings = dict(task="csv", csv_path=str(REPO / "tests" / "fixtures" / "stsb_pairs.csv"),
                    csv_text_columns=("sentence1", "sentence2"), csv_target="score",
                    csv_test_path=str(test), n_folds=2, model="tiny", epochs=2, lr=1e-3,
                    max_train_examples=48, eval_batch_size=8, save_checkpoints=False,
                    report_to=("none",))
    straight_cfg, _, cfg, ran, stopped = stopped_inside_pass(
        tmp_path, monkeypatch, settings, "eval", after=1, rows=30)     # the test's 30 rows
    assert ran == [1]                         # the first of 4 batches, then the stop
    assert (stopped["epoch"], stopped["batch"], stopped["during"]) == (2, None, "test prediction")
    assert not (run_dir_of(cfg) / "submission.csv").exists()
    assert fit(cfg)["resumed_after_epoch"] == 1
    assert ((run_dir_of(cfg) / "submission.csv").read_bytes()
            == (run_dir_of(straight_cfg) / "submission.csv").read_bytes())
    assert not checkpoint_dir(run_dir_of(cfg)).exists()


# ---------------------------------------------------------------- 7. other hardware

def killed_after_epoch_0(tmp_path, monkeypatch, **extra) -> RunConfig:
    """A run killed at the first step of epoch 1: its checkpoint is epoch 0's end."""
    cfg = RunConfig(**{**TINY, **extra}, outputs_dir=str(tmp_path / "killed"))
    dies_at_step(monkeypatch, 7)
    with pytest.raises(Killed):
        fit(cfg)
    monkeypatch.undo()
    return cfg


def rewrite_progress(cfg: RunConfig, **written_on) -> Path:
    last = checkpoint_dir(run_dir_of(cfg)) / "last"
    state = json.loads((last / "progress.json").read_text())
    state["written_on"].update(written_on)
    (last / "progress.json").write_text(json.dumps(state))
    return last


# what `auto` resolved to on this machine (bf16 on a native-bf16 CPU or with SSA_KIT_CPU_BF16=native,
# else fp32), and the other class's: the hardware checks are about the record, not the class
OTHER_PRECISION = {"bf16": ("bf16", "no", "fp32"), "no": ("fp32", "bf16", "bf16")}


def test_a_checkpoint_of_other_hardware_is_refused_in_one_line(tmp_path, monkeypatch):
    cfg = killed_after_epoch_0(tmp_path, monkeypatch)
    last = checkpoint_dir(run_dir_of(cfg)) / "last"
    written_on = json.loads((last / "progress.json").read_text())["written_on"]
    here = accel.machine_precision("auto")
    # on a GPU the record also names it (gpu, gpus): the lines below take it from describe()
    assert {k: written_on[k] for k in ("precision", "device", "processes")} == {
        "precision": here, "device": accel.machine_device(), "processes": 1}
    here_line = khw.describe(written_on)              # "fp32 on cpu x1" on this CPU
    other = OTHER_PRECISION[here][1]
    rewrite_progress(cfg, precision=other)
    with pytest.raises(CheckpointError) as err:
        fit(cfg)
    assert str(err.value) == (
        f"{last} was written with {khw.describe({**written_on, 'precision': other})}; this run "
        f"has {here_line} (mixed_precision auto resolves per machine): resume it on hardware like "
        "that, set resume_on_other_hardware: true to resume anyway (not bit-exact), or delete "
        "that folder to restart the run from scratch")
    rewrite_progress(cfg, precision=here, device="cuda", processes=4)
    four = re.escape(khw.describe({**written_on, "device": "cuda", "processes": 4}))
    with pytest.raises(CheckpointError, match=rf"was written with {four}; this run has "
                                              rf"{re.escape(here_line)}: resume it on hardware "
                                              r"like that \(--processes 4\), set resume_on_other_"):
        fit(cfg)


def test_resume_on_other_hardware_goes_on_and_notes_it(tmp_path, monkeypatch, comparable):
    """Allowed, a checkpoint said to be of 2 processes (DDP's `module.` weight names, a second
    RNG file) resumes here in one; as it really came from this machine, the run still ends as the
    uninterrupted one, which shows every weight was loaded under its DDP name."""
    from safetensors.torch import load_file, save_file
    straight = fit(RunConfig(**TINY, outputs_dir=str(tmp_path / "straight")))
    cfg = killed_after_epoch_0(tmp_path, monkeypatch)
    last = rewrite_progress(cfg, processes=2)
    written_on = json.loads((last / "progress.json").read_text())["written_on"]
    model = last / "model.safetensors"
    save_file({f"module.{k}": v for k, v in load_file(model).items()}, model)
    (last / "random_states_1.pkl").write_bytes((last / "random_states_0.pkl").read_bytes())
    resumed = fit(RunConfig(**TINY, outputs_dir=str(tmp_path / "killed"),
                            resume_on_other_hardware=True))
    here = khw.describe({**written_on, "processes": 1})    # "fp32 on cpu x1" on this CPU
    assert resumed["resumed_on_other_hardware"] == [
        f"{last} was written with {khw.describe(written_on)}; this run has {here}: resumed there "
        "(resume_on_other_hardware), not bit for bit"]
    assert read_metrics(run_dir_of(cfg))["resumed_on_other_hardware"] == \
        resumed["resumed_on_other_hardware"]
    assert comparable(resumed) == comparable(straight)
    assert straight["resumed_on_other_hardware"] == []


A100 = "NVIDIA A100-SXM4-80GB"
H100 = "NVIDIA H100 80GB HBM3"


def pretend_gpus(monkeypatch, name: str, count: int) -> None:
    """`hardware()` as a CUDA machine with `count` GPUs of model `name` records it: the run
    itself trains on this CPU, torch.cuda's answers are pretended only inside the record."""
    real = khw.hardware

    def on_gpus(accelerator) -> dict:
        with pytest.MonkeyPatch.context() as m:
            m.setattr(torch.cuda, "get_device_name", lambda device=None: name)
            m.setattr(torch.cuda, "device_count", lambda: count)
            return real(SimpleNamespace(mixed_precision=accelerator.mixed_precision,
                                        device=torch.device("cuda", 0),
                                        num_processes=accelerator.num_processes))
    monkeypatch.setattr(khw, "hardware", on_gpus)


def test_the_record_names_the_gpu_model_and_how_many_are_visible(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: f"{H100} #{device}")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    gpu = SimpleNamespace(mixed_precision="bf16", device=torch.device("cuda", 1), num_processes=2)
    assert khw.hardware(gpu) == {"precision": "bf16", "device": "cuda", "processes": 2,
                                 "gpu": f"{H100} #cuda:1", "gpus": 4}
    assert khw.describe(khw.hardware(gpu)) == f"bf16 on cuda x2 ({H100} #cuda:1, 4 visible)"
    cpu = SimpleNamespace(mixed_precision="no", device=torch.device("cpu"), num_processes=1)
    assert khw.hardware(cpu) == {"precision": "no", "device": "cpu", "processes": 1}


def test_a_checkpoint_of_another_gpu_model_is_refused_or_resumed_with_a_note(tmp_path,
                                                                             monkeypatch):
    """A100 -> H100: the same precision, device type and processes, so before the record named
    the model this resumed as bit-exact; now it is refused in one line naming both, or with
    resume_on_other_hardware resumed and noted."""
    cfg = killed_after_epoch_0(tmp_path, monkeypatch)
    last = rewrite_progress(cfg, device="cuda", gpu=A100, gpus=1)
    pretend_gpus(monkeypatch, H100, 1)
    here = OTHER_PRECISION[accel.machine_precision("auto")][0]
    line = (f"{last} was written with {here} on cuda x1 ({A100}, 1 visible); this run has {here} "
            f"on cuda x1 ({H100}, 1 visible)")
    with pytest.raises(CheckpointError) as err:
        fit(cfg)
    assert str(err.value) == (
        f"{line}: resume it on hardware like that, set resume_on_other_hardware: true to resume "
        "anyway (not bit-exact), or delete that folder to restart the run from scratch")
    resumed = fit(RunConfig(**TINY, outputs_dir=str(tmp_path / "killed"),
                            resume_on_other_hardware=True))
    assert resumed["resumed_on_other_hardware"] == [
        f"{line}: resumed there (resume_on_other_hardware), not bit for bit"]


@pytest.mark.parametrize("change", ["gpu", "gpu+count", "precision", "processes"])
def test_a_slurm_requeue_onto_another_gpu_model_goes_on_and_says_so(tmp_path, monkeypatch,
                                                                      change):
    """Inside a SLURM job (a mixed partition: A100 nodes and H100 nodes), a requeued run whose
    only change is the GPU node resumes, noted in resumed_on_other_hardware; a change of
    precision or of processes is still refused in one line."""
    cfg = killed_after_epoch_0(tmp_path, monkeypatch)
    here = OTHER_PRECISION[accel.machine_precision("auto")]
    written = {"gpu": {"device": "cuda", "gpu": A100, "gpus": 1},
               "gpu+count": {"device": "cuda", "gpu": A100, "gpus": 2},
               "precision": {"device": "cuda", "gpu": H100, "gpus": 1, "precision": here[1]},
               "processes": {"device": "cuda", "gpu": H100, "gpus": 1, "processes": 2}}[change]
    last = rewrite_progress(cfg, **written)
    pretend_gpus(monkeypatch, H100, 1)
    monkeypatch.setenv("SLURM_JOB_ID", "41")
    then = khw.describe(json.loads((last / "progress.json").read_text())["written_on"])
    line = f"{last} was written with {then}; this run has {here[0]} on cuda x1 ({H100}, 1 visible)"
    if change.startswith("gpu"):
        resumed = fit(cfg)
        assert resumed["status"] == "ok" and resumed["resumed_on_other_hardware"] == [
            f"{line}: resumed there (a SLURM job requeued onto another GPU node), not bit for bit"]
        return
    with pytest.raises(CheckpointError) as err:
        fit(cfg)
    auto = " (mixed_precision auto resolves per machine)" if change == "precision" else ""
    assert str(err.value).startswith(f"{line}{auto}: resume it on hardware like that")


def test_another_gpu_count_allowed_is_resumed_and_noted_not_an_rng_failure(tmp_path,
                                                                           monkeypatch):
    """accelerate saves one CUDA RNG state per visible GPU and restores them by index: 8 states
    on a node of 4 cannot all come back. Allowed, that is a note on other hardware, not the
    refusal of an RNG that was not restored."""
    cfg = killed_after_epoch_0(tmp_path, monkeypatch)
    last = rewrite_progress(cfg, device="cuda", gpu=H100, gpus=8)
    pretend_gpus(monkeypatch, H100, 4)
    resumed = fit(RunConfig(**TINY, outputs_dir=str(tmp_path / "killed"),
                            resume_on_other_hardware=True))
    here = OTHER_PRECISION[accel.machine_precision("auto")][0]
    assert resumed["resumed_on_other_hardware"] == [
        f"{last} was written with {here} on cuda x1 ({H100}, 8 visible); this run has {here} on "
        f"cuda x1 ({H100}, 4 visible): resumed there (resume_on_other_hardware), not bit for bit"]


def test_a_record_without_the_gpu_is_unknown_there_not_different(tmp_path, monkeypatch):
    """A checkpoint written on a GPU before the record named it: its model is unknown, so it
    resumes on any; its count is what its RNG file holds (one CUDA state per visible GPU)."""
    cfg = killed_after_epoch_0(tmp_path, monkeypatch)
    last = rewrite_progress(cfg, device="cuda")
    pretend_gpus(monkeypatch, H100, 2)
    assert fit(cfg)["resumed_on_other_hardware"] == []
    monkeypatch.undo()                    # the next checkpoint is written on this CPU again
    cfg = killed_after_epoch_0(tmp_path / "again", monkeypatch)
    last = rewrite_progress(cfg, device="cuda")
    rng = last / "random_states_0.pkl"
    from accelerate.utils import load
    states = load(rng)                     # what accelerate reads back (numpy's state allowed)
    torch.save({**states, "torch_cuda_manual_seed": [torch.get_rng_state()] * 4}, rng)
    pretend_gpus(monkeypatch, H100, 2)
    here = OTHER_PRECISION[accel.machine_precision("auto")][0]
    with pytest.raises(CheckpointError, match=re.escape(
            f"was written with {here} on cuda x1 (4 visible); this run has {here} on cuda x1 "
            f"({H100}, 2 visible): resume it on hardware like that, set resume_on_other_")):
        fit(cfg)


def test_an_rng_state_accelerate_failed_to_restore_is_an_error(tmp_path, monkeypatch):
    """accelerate's load_state swallows a failed RNG restore (a log line at INFO); the run
    would go on with other dropout masks."""
    cfg = killed_after_epoch_0(tmp_path, monkeypatch)

    def fails(state):
        raise RuntimeError("no such generator")
    monkeypatch.setattr(torch, "set_rng_state", fails)
    with pytest.raises(CheckpointError, match="random number generator states were not "
                                              "restored .*resume_on_other_hardware: true"):
        fit(cfg)


# ---------------------------------------------------------------- 8. accumulation, crashes

def test_the_epochs_last_short_accumulation_steps_so_a_resume_is_exact(tmp_path, monkeypatch,
                                                                      comparable):
    """grad_accum 2 over 5 batches an epoch: the epoch's fifth batch is an update of its own
    (weighted as one), in the uninterrupted run as in one resumed from epoch 0's end."""
    settings = dict(synthetic_size=80, grad_accum=2)
    straight_cfg = RunConfig(**{**TINY, **settings}, outputs_dir=str(tmp_path / "straight"))
    straight = fit(straight_cfg)
    cfg = RunConfig(**{**TINY, **settings}, outputs_dir=str(tmp_path / "killed"))
    dies_at_step(monkeypatch, 6)                     # epoch 1's first batch
    with pytest.raises(Killed):
        fit(cfg)
    monkeypatch.undo()
    resumed = fit(cfg)
    assert resumed["resumed_after_epoch"] == 0
    assert comparable(resumed) == comparable(straight)
    assert weights(cfg) == weights(straight_cfg)


def test_stale_temporary_folders_of_a_killed_run_go_when_it_resumes(tmp_path):
    cfg = RunConfig(**{**TINY, "epochs": 1, "synthetic_size": 32},
                    outputs_dir=str(tmp_path))
    folder = checkpoint_dir(run_dir_of(cfg))
    stale = [folder / ".epoch0.k2j4_x.tmp", folder / ".epoch0.k2j4_x.old", folder / "last.tmp"]
    for path in stale:
        path.mkdir(parents=True)
        (path / "set0.npz").write_bytes(b"half an epoch")
    fit(cfg)
    assert sorted(p.name for p in folder.iterdir()) == ["best", "last"]


def fsync_log(monkeypatch) -> list:
    """Record os.fsync (by path), os.replace and os.rename, in order."""
    log = []
    for name in ("fsync", "replace", "rename"):
        real = getattr(os, name)

        def wrapped(*args, _real=real, _name=name):
            if _name == "fsync":
                log.append(("fsync", Path(os.readlink(f"/proc/self/fd/{args[0]}")).name))
            else:
                log.append((_name, Path(args[0]).name, Path(args[1]).name))
            return _real(*args)
        monkeypatch.setattr(os, name, wrapped)
    return log


def test_files_reach_the_disk_before_they_are_renamed_into_place(tmp_path, monkeypatch):
    monkeypatch.setenv("SSA_KIT_FSYNC", "1")          # the suite may turn flushing off
    log = fsync_log(monkeypatch)
    kio.write_json(tmp_path / "metrics.json", {"status": "ok"})
    tmp = log[1][1]
    assert tmp.startswith(".metrics.json.") and log == [
        ("fsync", tmp), ("replace", tmp, "metrics.json"), ("fsync", tmp_path.name)]

    log.clear()                                     # a checkpoint swapped in over the old one
    (tmp_path / "last").mkdir()
    (tmp_path / "last.tmp" / "sub").mkdir(parents=True)
    (tmp_path / "last.tmp" / "model.safetensors").write_bytes(b"w")
    (tmp_path / "last.tmp" / "sub" / "x").write_bytes(b"x")
    kio.swap_in(tmp_path / "last.tmp", tmp_path / "last", tmp_path / "last.old")
    assert log == [("fsync", "x"), ("fsync", "sub"), ("fsync", "model.safetensors"),
                   ("fsync", "last.tmp"), ("rename", "last", "last.old"),
                   ("rename", "last.tmp", "last"), ("fsync", tmp_path.name)]

    log.clear()                                     # an epoch's examples (kit.io.atomic_dir)
    with kio.atomic_dir(tmp_path / "epoch1") as folder:
        (folder / "plan.npz").write_bytes(b"p")
    assert [e[0] for e in log] == ["fsync", "fsync", "rename", "fsync"]
    assert log[0] == ("fsync", "plan.npz") and log[2][2] == "epoch1"


# ---------------------------------------------------------------- 8d. threads

def test_threads_come_from_the_jobs_cpus_not_the_nodes(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(6)))
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "8")
    assert accel.cpu_threads() == 8 and accel.cpu_threads(2) == 4 and accel.cpu_threads(16) == 1
    monkeypatch.delenv("SLURM_CPUS_PER_TASK")
    assert accel.cpu_threads() == 6 and accel.cpu_threads(4) == 1
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "")      # set but empty: the affinity
    assert accel.cpu_threads(3) == 2

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")          # torchrun: 2 processes on this node
    monkeypatch.setattr(torch, "get_num_threads", lambda: 64)
    set_to = []
    monkeypatch.setattr(torch, "set_num_threads", set_to.append)
    accel.limit_threads()
    assert set_to == [3]
    monkeypatch.setenv("OMP_NUM_THREADS", "64")         # the user's own setting stands
    accel.limit_threads()
    assert set_to == [3]


def test_no_module_takes_its_threads_from_the_nodes_core_count():
    hits = [str(p.relative_to(REPO)) for p in (REPO / "kit").rglob("*.py")
            if "cpu_count()" in p.read_text() and p.name not in ("accel.py", "doctor.py")]
    assert not hits             # accel.cpu_threads' fallback; the doctor prints the machine's
