"""Preemption: SIGTERM, SIGUSR1 or SIGINT stops a run after its current step with a mid-epoch
checkpoint and status preempted (not failed); rerunning resumes inside the epoch (same batches,
RNGs, optimizer, lr, SSA labels, history) and ends with the uninterrupted run's metrics, for every
method family. Two processes: tests/test_distributed.py; a batch stopped by SIGUSR1 (its exit
status 75, its line, the preempted point resumed first) on a real scheduler: tests/test_slurm.py."""
import json
import os
import signal

import pandas as pd
import pytest

from kit.config.run_config import RunConfig
from kit.results.frame import collect
from kit.runs import RunPreempted, checkpoint_dir, read_metrics, run_dir_of
from kit.train import loop, preemption
from kit.train.finetune import fit

QUIET = dict(model="tiny", lr=5e-3, batch_size=16, epochs=2, report_to=("none",))
FAMILIES = {     # method family: (settings, the signal it is stopped with)
    "ssa": (dict(task="synthetic", method="ssa-h", synthetic_size=240), signal.SIGTERM),
    "bert-mask": (dict(task="synthetic", method="bert-mask", synthetic_size=160), signal.SIGUSR1),
    # kit.models.packed_dropout: its stream restored from the checkpoint's generator state
    "packed-dropout": (dict(task="synthetic", method="bert", synthetic_size=160,
                            dropout_rng="packed"), signal.SIGTERM),
    "multitask": (dict(task="multitask", tasks=("synthetic", "synthetic-pair"), method="gated",
                       synthetic_size=96, gate_start_epoch=1, freeze_qkv_epoch=1), signal.SIGINT),
    "mlm": (dict(task="CoLA", method="mlm", max_train_examples=160, max_length=32),
            signal.SIGTERM),
}

pytestmark = pytest.mark.usefixtures("one_thread")      # conftest.py


def counting_steps(monkeypatch, at: int | None = None, signum: int = signal.SIGTERM) -> list:
    """Count the loop's training steps; at step `at` (1-based) the process signals itself from
    inside the step, as a scheduler's signal would land."""
    calls, step = [], loop.train_step

    def wrapped(*args, **kwargs):
        calls.append(1)
        if len(calls) == at:
            os.kill(os.getpid(), signum)
        return step(*args, **kwargs)
    monkeypatch.setattr(loop, "train_step", wrapped)
    return calls


def history(cfg: RunConfig) -> pd.DataFrame:
    return pd.read_csv(run_dir_of(cfg) / "history.csv").drop(columns="wall_s")


@pytest.mark.parametrize("family", FAMILIES)
def test_a_signal_mid_epoch_stops_with_a_checkpoint_and_the_rerun_ends_as_if_uninterrupted(
        family, tmp_path, monkeypatch, comparable):
    settings, signum = FAMILIES[family]
    settings = {**QUIET, **settings}
    steps = counting_steps(monkeypatch)
    straight_cfg = RunConfig(**settings, outputs_dir=str(tmp_path / "straight"))
    straight = fit(straight_cfg)
    at = len(steps) * 3 // 4                 # inside the second epoch (its SSA labels too)
    counting_steps(monkeypatch, at, signum)
    cfg = RunConfig(**settings, outputs_dir=str(tmp_path / "stopped"))
    with pytest.raises(RunPreempted):
        fit(cfg)
    record = read_metrics(run_dir_of(cfg))
    stopped = record["preempted"]
    assert record["status"] == "preempted" and record["error"] is None
    assert stopped["signal"] == signum.name and stopped["step"] == at and stopped["epoch"] == 2
    assert 0 < stopped["batch"] and stopped["checkpoint"].endswith("checkpoint/last")
    assert (checkpoint_dir(run_dir_of(cfg)) / "epoch1" / "plan.safetensors").exists()
    assert signal.getsignal(signum) is not preemption.Stop.note   # the handlers are put back
    row = collect.load_runs([run_dir_of(cfg)]).iloc[0]     # not finished: no table counts it
    assert row["status"] == "missing" and row["error"].startswith(f"preempted ({signum.name})")

    resumed = fit(cfg)
    assert resumed["status"] == "ok"
    assert resumed["resumed_inside_epoch"] == {"epoch": 1, "position": stopped["batch"]}
    assert comparable(resumed) == comparable(straight)
    assert history(cfg).equals(history(straight_cfg))
    # the same weights, bit for bit (for masked-LM: the masks are drawn from seed, epoch, rows)
    a, b = (checkpoint_dir(run_dir_of(c)) / "best" / "model.safetensors"
            for c in (cfg, straight_cfg))
    assert a.read_bytes() == b.read_bytes()
    assert not list(checkpoint_dir(run_dir_of(cfg)).glob("epoch*"))  # kept only inside an epoch


def test_checkpoints_by_step_count_resume_where_the_last_one_was(tmp_path, monkeypatch,
                                                                 comparable):
    """checkpoint_steps: a checkpoint every N steps; a SIGKILL (no chance to write one) loses
    only the steps since the last of them."""
    settings = {**QUIET, **FAMILIES["ssa"][0], "checkpoint_steps": 4}
    straight = fit(RunConfig(**settings, outputs_dir=str(tmp_path / "straight")))
    cfg = RunConfig(**settings, outputs_dir=str(tmp_path / "killed"))

    class Killed(BaseException):          # stands in for SIGKILL: nothing runs after it
        pass
    calls, step = [], loop.train_step

    def dies_at_step_22(*args, **kwargs):
        calls.append(1)
        if len(calls) == 22:
            raise Killed
        return step(*args, **kwargs)
    monkeypatch.setattr(loop, "train_step", dies_at_step_22)
    with pytest.raises(Killed):
        fit(cfg)
    monkeypatch.setattr(loop, "train_step", step)
    state = json.loads((checkpoint_dir(run_dir_of(cfg)) / "last" / "progress.json").read_text())
    assert state["step"] == 20                # the last multiple of 4 before the kill
    resumed = fit(cfg)
    assert comparable(resumed) == comparable(straight)


def test_a_signal_outside_any_run_leaves_the_handlers_as_they_were():
    before = {s: signal.getsignal(s) for s in preemption.SIGNALS}
    stop = preemption.Stop()
    with preemption.catching(stop):
        os.kill(os.getpid(), signal.SIGUSR1)
        assert stop.signal == "SIGUSR1"
    assert {s: signal.getsignal(s) for s in preemption.SIGNALS} == before


def test_a_rerun_takes_its_preempted_points_first(tmp_path):
    from kit import batch, io as kio
    points = [dict(task="synthetic", method=m, model="tiny", outputs_dir=str(tmp_path))
              for m in ("bert", "ssa-h", "bert-mask")]
    kio.write_json(run_dir_of(RunConfig.from_dict(points[1])) / "metrics.json",
                   {"status": "preempted"})
    assert [p["method"] for p in batch.resume_first(points)] == ["ssa-h", "bert", "bert-mask"]
