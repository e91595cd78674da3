"""Data-parallel runs: 2 CPU processes (gloo), through the entry points a user would use
(`python -m kit.batch PROFILE --processes 2`, `torchrun -m kit.train.finetune config.json`).

What must equal a 1-process run exactly: the SSA labels drawn from the same weights (epoch 0
probes the initial model when ssa_start_epoch is 0), global counts (steps, examples), one set
of files. What cannot (each rank has its own dropout stream, DDP sums gradients in another
order): the trained weights, so the dev metric only within a stated tolerance.

Each process imports torch and transformers (seconds of CPU), so the launches are few: one per
method family, and each run serves every test it can (the SSA-H fixture below).
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
from filelock import FileLock

from kit.config.run_config import RunConfig
from kit.runs import read_saved_epoch, run_dir_of
from kit.train.finetune import fit

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "SSA_KIT_PROGRESS": "off"}
# 40 steps of 4 (2 a rank): a signal after the first checkpoint (4 steps) leaves most of the
# epoch. A history row per step: a resumed run's rows then equal an uninterrupted one's (a row
# of several steps averages only those since the resume)
SSA = dict(task="synthetic", model="tiny", method="ssa-h", synthetic_size=160, epochs=1, lr=5e-3,
           batch_size=4, ssa_start_epoch=0, guide_loss="task+both", save_labels=True,
           log_every=1, report_to=("none",))
CHECKPOINT_STEPS = 4
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


@pytest.fixture(scope="module")
def ssa_h(one_thread, shared_tmp) -> Path:
    """The SSA-H and pretraining runs every test below the fixture reads (each launch costs
    seconds of CPU per process, mostly imports). Beside one process (this one): two batches of
    one process each meet as two nodes (a c10d rendezvous on localhost, what --nodes does
    across machines) and run SSA-H uninterrupted; a torchrun of the same point with two
    processes gets SIGTERM to rank 1 only, mid-epoch; then one batch with --processes 2 resumes
    that point and runs masked-LM pretraining. Exit statuses and logs are kept for the tests."""
    return once(shared_tmp / "ssa-h", launch_ssa_h)


def once(folder: Path, make) -> Path:
    """`folder` filled by `make(folder)`, once a session: xdist's workers share it (a lock and a
    `done` file beside it: conftest.py's shared_tmp), and a failure is each test's, with its
    message."""
    with FileLock(f"{folder}.lock"):
        if (folder / "failed").exists():
            pytest.fail((folder / "failed").read_text())
        if not (folder / "done").exists():
            folder.mkdir()
            try:
                make(folder)
            except BaseException as err:
                (folder / "failed").write_text(f"{type(err).__name__}: {err}")
                raise
            (folder / "done").touch()
    return folder


def launch_ssa_h(root: Path) -> None:
    fit(RunConfig(**SSA, outputs_dir=str(root / "one")))
    fit(RunConfig(**MLM, outputs_dir=str(root / "one")))
    profile = profile_of(root / "ddp.yaml", SSA)
    nodes = [subprocess.Popen([sys.executable, "-m", "kit.batch", str(profile), "--outputs",
                               str(root / "nodes"), "--no-report", "--nodes", "2", "--rdzv",
                               f"localhost:{29500 + os.getpid() % 500}"], cwd=REPO, env=ENV,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for _ in range(2)]
    try:    # the batch's SSA-H point, checkpointed (checkpoint_steps is no part of its identity)
        stop_one_rank(point(root / "two", {**SSA, "checkpoint_steps": CHECKPOINT_STEPS}), root)
        both = profile_of(root / "both" / "ddp.yaml", SSA, MLM)     # the same profile name
        proc = subprocess.run([sys.executable, "-m", "kit.batch", str(both), "--outputs",
                               str(root / "two"), "--processes", "2", "--no-report"], cwd=REPO,
                              env=ENV, capture_output=True, text=True, timeout=600)
        (root / "both.log").write_text(f"{proc.returncode}\n{proc.stdout}{proc.stderr}")
    finally:
        for i, node in enumerate(nodes):
            log = node.communicate(timeout=600)[0]
            (root / f"node{i}.log").write_text(f"{node.returncode}\n{log}")


def stop_one_rank(cfg: RunConfig, root: Path) -> None:
    """torchrun of `cfg` on two processes, SIGTERM to rank 1 after its first checkpoint; keeps
    torchrun's exit status and the run's record (the resumed run overwrites it)."""
    proc = torchrun(cfg, root, wait=False)
    state = run_dir_of(cfg) / "checkpoint" / "last"   # swapped in whole
    started = time.time()
    while not state.exists():
        assert proc.poll() is None, "the run ended before its first checkpoint"
        assert time.time() - started < 300
        time.sleep(0.05)
    os.kill(worker(root / f"{cfg.run_id}.json", rank=1), signal.SIGTERM)
    (root / "stopped.exit").write_text(str(proc.wait(timeout=300)))
    (root / "stopped.json").write_bytes((run_dir_of(cfg) / "metrics.json").read_bytes())


def point(out: Path, cfg: dict = SSA) -> RunConfig:
    """A profile "ddp" point's run config, as the batch writing to `out` makes it."""
    return RunConfig(**cfg, outputs_dir=str(out.resolve()), profile="ddp")


def exit_and_log(path: Path) -> tuple[int, str]:
    code, _, log = path.read_text().partition("\n")
    return int(code), log


def metrics(cfg: RunConfig) -> dict:
    return json.loads((run_dir_of(cfg) / "metrics.json").read_text())


def test_ssa_h_on_two_nodes_equals_one_process_in_its_labels_and_counts(ssa_h):
    """The uninterrupted 2-node run against one process: the same labels and counts, files
    written once, the dev metric within a tolerance."""
    for i in range(2):
        code, log = exit_and_log(ssa_h / f"node{i}.log")
        assert code == 0 and "1 ok, 0 skipped, 0 failed" in log, log[-3000:]
    one_cfg = RunConfig(**SSA, outputs_dir=str(ssa_h / "one"))
    one, cfg = metrics(one_cfg), point(ssa_h / "nodes")
    two = metrics(cfg)
    assert two["status"] == "ok" and two["processes"] == 2 and one["processes"] == 1
    # global counts, identical to one process
    assert two["train_examples"] == one["train_examples"]
    assert len(two["epochs"]) == len(one["epochs"]) == 1
    # the SSA labels of epoch 0 (probed from the same initial weights): bit for bit
    a, b = labels(one_cfg), labels(cfg)
    assert [x.tolist() for x in a["ssa_labels"]] == [x.tolist() for x in b["ssa_labels"]]
    assert [x.tolist() for x in a["input_ids"]] == [x.tolist() for x in b["input_ids"]]
    strip = {k: v for k, v in one["ssa_labels"][0].items() if k != "wall_s"}
    assert strip == {k: v for k, v in two["ssa_labels"][0].items() if k != "wall_s"}
    # written once: one history row per logging step, one prediction per dev row
    run = run_dir_of(cfg)
    history = (run / "history.csv").read_text().splitlines()
    assert len(history) - 1 == len((run_dir_of(one_cfg) / "history.csv").read_text()
                                   .splitlines()) - 1
    dev_rows = (run / "predictions" / "dev.tsv").read_text().splitlines()
    assert len(dev_rows) - 1 == 40 and len({r.split("\t")[0] for r in dev_rows[1:]}) == 40
    assert abs(two["best_dev"]["accuracy"] - one["best_dev"]["accuracy"]) <= DEV_TOLERANCE


def test_two_nodes_of_one_process_and_one_node_of_two_are_the_same_run(ssa_h, comparable):
    """Bit for bit: the same world of two ranks (the same dropout streams, the same gloo
    reductions in the same order), whichever node a rank runs on; the one-node run was
    stopped and resumed on the way (the signal test below), which changes nothing either."""
    code, log = exit_and_log(ssa_h / "both.log")
    assert code == 0, log
    assert "2 ok, 0 skipped, 0 failed" in log
    run, processes = run_dir_of(point(ssa_h / "nodes")), run_dir_of(point(ssa_h / "two"))
    same_node = json.loads((processes / "metrics.json").read_text())
    assert same_node["processes"] == 2
    assert comparable(same_node) == comparable(metrics(point(ssa_h / "nodes")))
    assert _losses(processes) == _losses(run)
    assert (processes / "predictions" / "dev.tsv").read_bytes() == \
        (run / "predictions" / "dev.tsv").read_bytes()


def test_pretraining_on_two_processes_through_the_batch_runner(ssa_h):
    """Masked-LM pretraining, lr ~0: the same weights on both ranks, so the held-out loss summed
    over both ranks' slices equals one process's; global counts as one process's."""
    one_mlm = metrics(RunConfig(**MLM, outputs_dir=str(ssa_h / "one")))
    mlm = metrics(point(ssa_h / "two", MLM))
    assert mlm["status"] == "ok" and mlm["processes"] == 2 and one_mlm["processes"] == 1
    assert mlm["train_examples"] == one_mlm["train_examples"]
    assert mlm["heldout_masked_tokens"] == one_mlm["heldout_masked_tokens"]
    assert mlm["best_dev"]["mlm_loss"] == pytest.approx(one_mlm["best_dev"]["mlm_loss"], rel=1e-5)
    table = (ssa_h / "two" / "tables" / "ddp.md").read_text()
    assert "Pretraining (held-out masked-LM loss" in table


def test_a_signal_to_one_rank_stops_both_at_one_checkpoint_and_resume_equals_uninterrupted(
        ssa_h):
    """SIGTERM to rank 1 only, mid-epoch: both ranks stop after the same step (they agree on it
    every step), write one checkpoint and record preempted; the batch runs the point again,
    resumes inside the epoch and ends with the uninterrupted 2-process run's metrics (the
    2-node run: the test above shows the two the same run). SSA-H with both attention guiding
    losses: the labels of epoch 0 come back from the checkpoint."""
    assert int((ssa_h / "stopped.exit").read_text()) != 0
    record = json.loads((ssa_h / "stopped.json").read_text())
    assert record["status"] == "preempted", record
    assert record["preempted"]["signal"] == "a signal to another rank"   # rank 0 writes
    resumed, straight = metrics(point(ssa_h / "two")), metrics(point(ssa_h / "nodes"))
    assert straight["resumed_inside_epoch"] is None
    assert resumed["resumed_inside_epoch"]["epoch"] == 0     # the first epoch, mid-way
    drop = ("wall_s",)
    same = lambda rows: [{k: v for k, v in r.items() if k not in drop} for r in rows]  # noqa: E731
    assert same(resumed["epochs"]) == same(straight["epochs"])
    assert same(resumed["ssa_labels"]) == same(straight["ssa_labels"])


# SSA-H with guiding, and masked-LM pretraining: the tests above; augmentation + guiding
# (bert-mask with task+both) and multi-task with its stages: here
@pytest.mark.parametrize("extra", [
    dict(method="gated", task="multitask", tasks=("RTE", "WNLI"), max_train_examples=32,
         epochs=3, gate_start_epoch=1, freeze_qkv_epoch=2),                 # multi-task, stages
    dict(method="bert-mask", guide_loss="task+both"),                      # augmentation, guiding
])
def test_other_method_families_train_on_two_processes(tmp_path, extra):
    cfg = RunConfig(**{**SSA, "method": "bert", "guide_loss": "task", "save_labels": False,
                       "batch_size": 16, "log_every": 10, **extra}, outputs_dir=str(tmp_path))
    two = torchrun(cfg, tmp_path)
    assert two["status"] == "ok" and two["processes"] == 2
    one = fit(RunConfig(**{**cfg.to_dict(), "outputs_dir": str(tmp_path / "one")}))
    assert two["train_examples"] == one["train_examples"]
    assert [e.get("task_batches") for e in two["epochs"]] == [e.get("task_batches")
                                                             for e in one["epochs"]]
