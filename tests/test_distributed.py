"""Data-parallel runs: 2 CPU processes (gloo), through the entry points a user would use
(`python -m kit.batch PROFILE --processes 2`, `torchrun -m kit.train.finetune config.json`).

What must equal a 1-process run exactly: the SSA labels drawn from the same weights (epoch 0
probes the initial model when ssa_start_epoch is 0), global counts (steps, examples), one set
of files. What cannot (each rank has its own dropout stream, DDP sums gradients in another
order): the trained weights, so the dev metric only within a stated tolerance.
"""
import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from kit.config.run_config import RunConfig
from kit.runs import read_saved_epoch, run_dir_of
from kit.train.finetune import fit

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "SSA_KIT_PROGRESS": "off"}
SSA = dict(task="synthetic", model="tiny", method="ssa-h", synthetic_size=160, epochs=1, lr=5e-3,
           batch_size=16, ssa_start_epoch=0, save_labels=True, report_to=("none",))
MLM = dict(task="CoLA", method="mlm", model="tiny", max_train_examples=64, max_length=32, epochs=1,
           lr=1e-12, batch_size=16, report_to=("none",))
DEV_TOLERANCE = 0.15       # accuracy points of a 40-row dev set, tiny random model


# each rank trains on the GPU of its local rank (cuda:1 for rank 1) where torch sees CUDA, else
# in a CPU process (gloo): on one GPU, two ranks cannot run
TWO_RANKS = pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.device_count() < 2,
                               reason="2 ranks on CUDA need 2 GPUs (rank 1 takes cuda:1); "
                                      "this machine has 1")
# the in-process reference runs with the ranks' thread count (OMP_NUM_THREADS=1 in ENV): float
# sums, and so a near-tied prediction, depend on it
pytestmark = [pytest.mark.usefixtures("one_thread"), TWO_RANKS]      # conftest.py


def torchrun(cfg: RunConfig, tmp_path: Path, n: int = 2, wait: bool = True):
    path = tmp_path / f"{cfg.run_id}.json"
    path.write_text(json.dumps(cfg.to_dict()))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={n}", "-m", "kit.train.finetune", str(path)]
    if not wait:
        return subprocess.Popen(cmd, cwd=REPO, env=ENV, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
    proc = subprocess.run(cmd, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((run_dir_of(cfg) / "metrics.json").read_text())


def worker(config: Path, rank: int) -> int:
    """The pid of the torchrun worker of `config` with this local rank."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if str(config).encode() in cmd and b"torch.distributed.run" not in cmd \
                and f"LOCAL_RANK={rank}".encode() in env:
            return int(pid)
    raise AssertionError(f"no rank {rank} worker of {config}")


def labels(cfg: RunConfig, epoch: int = 0):
    return read_saved_epoch(run_dir_of(cfg), epoch)["epoch_set"]


def _losses(run: Path) -> list[dict]:
    """history.csv's rows (step, epoch, losses, lr) less the wall clock."""
    with (run / "history.csv").open() as f:
        return [{k: v for k, v in row.items() if k != "wall_s"} for row in csv.DictReader(f)]


def profile_of(path: Path, *points: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"grid": [{k: list(v) if isinstance(v, tuple) else v
                                          for k, v in point.items()} for point in points]}))
    return path


def test_ssa_h_on_two_nodes_and_pretraining_on_two_processes_through_the_batch_runner(
        tmp_path, comparable):
    """Two batches of one process each meet as two nodes (a c10d rendezvous on localhost, what
    --nodes does across machines) and run SSA-H; beside them one batch with --processes 2 runs
    the same SSA-H point and masked-LM pretraining (lr ~0 there: the same weights on both ranks,
    so the held-out loss summed over both ranks' slices equals one process's). Both compared with
    one process; the two SSA-H runs with each other, bit for bit: the same world of two ranks
    (the same dropout streams, the same gloo reductions in the same order), whichever node a
    rank runs on."""
    one = fit(RunConfig(**SSA, outputs_dir=str(tmp_path / "one")))
    one_mlm = fit(RunConfig(**MLM, outputs_dir=str(tmp_path / "one")))
    nodes_out, out = tmp_path / "nodes", tmp_path / "two"
    profile = profile_of(tmp_path / "ddp.yaml", SSA)
    nodes = [subprocess.Popen([sys.executable, "-m", "kit.batch", str(profile), "--outputs",
                               str(nodes_out), "--no-report", "--nodes", "2", "--rdzv",
                               f"localhost:{29500 + os.getpid() % 500}"], cwd=REPO, env=ENV,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for _ in range(2)]
    both = profile_of(tmp_path / "both" / "ddp.yaml", SSA, MLM)     # the same profile name
    proc = subprocess.run([sys.executable, "-m", "kit.batch", str(both), "--outputs",
                           str(out), "--processes", "2", "--no-report"], cwd=REPO, env=ENV,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 ok, 0 skipped, 0 failed" in proc.stdout
    for node in nodes:
        log = node.communicate(timeout=600)[0]
        assert node.returncode == 0 and "1 ok, 0 skipped, 0 failed" in log, log[-3000:]
    cfg = RunConfig(**SSA, outputs_dir=str(nodes_out.resolve()), profile="ddp")
    two = json.loads((run_dir_of(cfg) / "metrics.json").read_text())
    assert two["status"] == "ok" and two["processes"] == 2 and one["processes"] == 1
    # global counts, identical to one process
    assert two["train_examples"] == one["train_examples"]
    assert len(two["epochs"]) == len(one["epochs"]) == 1
    # the SSA labels of epoch 0 (probed from the same initial weights): bit for bit
    a, b = labels(RunConfig(**SSA, outputs_dir=str(tmp_path / "one"))), labels(cfg)
    assert [x.tolist() for x in a["ssa_labels"]] == [x.tolist() for x in b["ssa_labels"]]
    assert [x.tolist() for x in a["input_ids"]] == [x.tolist() for x in b["input_ids"]]
    strip = {k: v for k, v in one["ssa_labels"][0].items() if k != "wall_s"}
    assert strip == {k: v for k, v in two["ssa_labels"][0].items() if k != "wall_s"}
    # written once: one history row per logging step, one prediction per dev row
    run = run_dir_of(cfg)
    history = (run / "history.csv").read_text().splitlines()
    assert len(history) - 1 == len((run_dir_of(RunConfig(**SSA, outputs_dir=str(tmp_path / "one")))
                                    / "history.csv").read_text().splitlines()) - 1
    dev_rows = (run / "predictions" / "dev.tsv").read_text().splitlines()
    assert len(dev_rows) - 1 == 40 and len({r.split("\t")[0] for r in dev_rows[1:]}) == 40
    assert abs(two["best_dev"]["accuracy"] - one["best_dev"]["accuracy"]) <= DEV_TOLERANCE
    # two nodes of one process and one node of two: the same run, bit for bit
    processes = run_dir_of(RunConfig(**SSA, outputs_dir=str(out.resolve()), profile="ddp"))
    same_node = json.loads((processes / "metrics.json").read_text())
    assert same_node["processes"] == 2
    assert comparable(same_node) == comparable(two)
    assert _losses(processes) == _losses(run)
    assert (processes / "predictions" / "dev.tsv").read_bytes() == \
        (run / "predictions" / "dev.tsv").read_bytes()
    # pretraining: the global counts and the held-out loss of one process
    mlm = json.loads((run_dir_of(RunConfig(**MLM, outputs_dir=str(out.resolve()), profile="ddp"))
                      / "metrics.json").read_text())
    assert mlm["status"] == "ok" and mlm["processes"] == 2 and one_mlm["processes"] == 1
    assert mlm["train_examples"] == one_mlm["train_examples"]
    assert mlm["heldout_masked_tokens"] == one_mlm["heldout_masked_tokens"]
    assert mlm["best_dev"]["mlm_loss"] == pytest.approx(one_mlm["best_dev"]["mlm_loss"], rel=1e-5)
    assert "Pretraining (held-out masked-LM loss" in (out / "tables" / "ddp.md").read_text()


# SSA-H and masked-LM pretraining: the test above; augmentation + guiding (bert-mask with
# task+both): the signal test below; multi-task with its stages: here
@pytest.mark.parametrize("extra", [
    dict(method="gated", task="multitask", tasks=("RTE", "WNLI"), max_train_examples=32,
         epochs=3, gate_start_epoch=1, freeze_qkv_epoch=2),                 # multi-task, stages
])
def test_other_method_families_train_on_two_processes(tmp_path, extra):
    cfg = RunConfig(**{**SSA, "method": "bert", "save_labels": False, **extra},
                    outputs_dir=str(tmp_path))
    two = torchrun(cfg, tmp_path)
    assert two["status"] == "ok" and two["processes"] == 2
    one = fit(RunConfig(**{**cfg.to_dict(), "outputs_dir": str(tmp_path / "one")}))
    assert two["train_examples"] == one["train_examples"]
    assert [e.get("task_batches") for e in two["epochs"]] == [e.get("task_batches")
                                                             for e in one["epochs"]]


def test_a_signal_to_one_rank_stops_both_at_one_checkpoint_and_resume_equals_uninterrupted(
        tmp_path):
    """SIGTERM to rank 1 only, mid-epoch: both ranks stop after the same step (they agree on it
    every step), write one checkpoint and record preempted; torchrun again resumes inside the
    epoch and ends with the uninterrupted 2-process run's metrics. The method family is BERT-mask
    with both attention guiding losses (augmentation + guiding on two processes)."""
    base = {**SSA, "method": "bert-mask", "guide_loss": "task+both", "synthetic_size": 600,
            "epochs": 2, "save_labels": False, "checkpoint_steps": 12}
    stopped = RunConfig(**base, outputs_dir=str(tmp_path / "stopped"))
    # the uninterrupted run trains alongside (its own config file): three torchrun starts are
    # most of this test's time, and two of them overlap
    (tmp_path / "straight").mkdir()
    straight_cfg = RunConfig(**{**base, "checkpoint_steps": 0},
                             outputs_dir=str(tmp_path / "straight"))
    straight_proc = torchrun(straight_cfg, tmp_path / "straight", wait=False)
    proc = torchrun(stopped, tmp_path, wait=False)
    state = run_dir_of(stopped) / "checkpoint" / "last"   # swapped in whole
    started = time.time()
    while not state.exists():
        assert proc.poll() is None, "the run ended before its first checkpoint"
        assert time.time() - started < 300
        time.sleep(0.05)
    os.kill(worker(tmp_path / f"{stopped.run_id}.json", rank=1), signal.SIGTERM)
    assert proc.wait(timeout=300) != 0
    record = json.loads((run_dir_of(stopped) / "metrics.json").read_text())
    assert record["status"] == "preempted", record
    assert record["preempted"]["signal"] == "a signal to another rank"   # rank 0 writes
    resumed = torchrun(stopped, tmp_path)
    assert straight_proc.wait(timeout=600) == 0, "the uninterrupted run failed"
    straight = json.loads((run_dir_of(straight_cfg) / "metrics.json").read_text())
    assert straight["resumed_inside_epoch"] is None
    assert resumed["resumed_inside_epoch"]["epoch"] == 0     # the first epoch, mid-way
    drop = ("wall_s",)
    same = lambda rows: [{k: v for k, v in r.items() if k not in drop} for r in rows]  # noqa: E731
    assert same(resumed["epochs"]) == same(straight["epochs"])
    assert same(resumed["ssa_labels"]) == same(straight["ssa_labels"])
