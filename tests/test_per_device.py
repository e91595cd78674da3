"""Several points at once on one device (`./run_all.sh PROFILE --per-device K`, kit.cluster.pool):
the smoke profile on two concurrent kernels gives a serial batch's metrics bit for bit (one torch
thread per point in both), a rerun skips them, a chain's points never overlap, and a signal
during a K = 2 batch preempts both running points, which a rerun resumes to the uninterrupted
results."""
import contextlib
import json
import os
import signal
import threading
import time

import pytest
import yaml

from kit import batch
from kit.cluster import kernels as kkernels, pool
from kit.config import grids
from kit.config.run_config import ConfigError, RunConfig
from kit.runs import run_dir_of

from tests.test_batch import REPO, _without_timings, write_profile


@pytest.fixture(scope="module")
def serial(tmp_path_factory, warm_kernels):
    """The smoke profile's 4 points one after another in the warm kernel (one torch thread):
    the outputs folder, and the profile file (its name makes the run ids)."""
    root = tmp_path_factory.mktemp("serial")
    profile = write_profile(root, (REPO / "params" / "smoke.yaml").read_text())
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(batch, "Kernels", lambda fresh=False: contextlib.nullcontext(warm_kernels))
        assert batch.run_profile(str(profile), outputs_dir=str(root / "out"), report=False) == 0
    return root / "out"


def smoke_copy(tmp_path):
    """params/smoke.yaml as `p.yaml` (the serial batch's profile name: the same run ids)."""
    return write_profile(tmp_path, (REPO / "params" / "smoke.yaml").read_text())


@pytest.fixture
def spans(monkeypatch):
    """[(kernel pid, start, end)] of every notebook a kernel of the batch executes."""
    got, execute = [], kkernels.Kernels.execute

    def timed(self, *args, **kwargs):
        start = time.monotonic()
        try:
            return execute(self, *args, **kwargs)
        finally:
            got.append((self._manager_pid, start, time.monotonic()))

    def warm(self, _warm=kkernels.Kernels._warm):
        manager = _warm(self)
        self._manager_pid = manager.provisioner.pid
        return manager

    monkeypatch.setattr(kkernels.Kernels, "_warm", warm)
    monkeypatch.setattr(kkernels.Kernels, "execute", timed)
    return got


def without_k(metrics: dict) -> dict:
    """metrics.json less the K it ran under (the one thing a K = 2 run records otherwise)."""
    return {**{k: v for k, v in metrics.items() if k != "per_device"},
            "environment": {k: v for k, v in metrics["environment"].items() if k != "per_device"}}


def same_runs(out, other, compare=_without_timings):
    names = sorted(p.name for p in (out / "runs").iterdir())
    assert names == sorted(p.name for p in (other / "runs").iterdir()) and len(names) == 4
    for name in names:
        a, b = (json.loads((o / "runs" / name / "metrics.json").read_text()) for o in (out, other))
        assert a["status"] == b["status"] == "ok"
        assert compare(a) == compare(b), name


def test_two_points_at_once_give_the_serial_metrics_and_a_rerun_skips_them(
        tmp_path, monkeypatch, capsys, serial, spans):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")         # each kernel: the serial run's one thread
    profile, out = smoke_copy(tmp_path), tmp_path / "out"
    assert batch.main([str(profile), "--outputs", str(out), "--per-device", "2",
                       "--no-report"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert ", 2 points at once; CUDA graphs: 0 of 4 points" in lines[0]
    assert "4 ok, 0 skipped, 0 failed" in lines[-1]
    assert sum(": started" in line for line in lines) == 4
    assert len({pid for pid, _, _ in spans}) == 2          # two kernels ...
    assert any(a[1] < b[2] and b[1] < a[2] for a in spans for b in spans if a[0] != b[0])  # at once
    records = [json.loads(p.read_text()) for p in (out / "runs").glob("*/metrics.json")]
    assert [(r["per_device"], r["environment"]["per_device"]) for r in records] == [(2, 2)] * 4
    same_runs(out, serial, lambda m: _without_timings(without_k(m)))
    spans.clear()
    assert batch.main([str(profile), "--outputs", str(out), "--per-device", "2",
                       "--no-report"]) == 0
    assert "0 ok, 4 skipped, 0 failed" in capsys.readouterr().out
    assert spans == []                                     # no notebook ran


def test_a_signal_preempts_both_running_points_and_a_rerun_resumes_them(
        tmp_path, monkeypatch, capsys, serial, comparable):
    """SIGUSR1 to the batch once both slots' points have their parameters (the moment a signal
    reaches fit() as soon as it starts): both stop with a checkpoint, the other two never start,
    exit 75; the same command again resumes both (first) and runs the rest, to the serial
    batch's results."""
    from papermill.engines import NotebookExecutionManager
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    profile, out = smoke_copy(tmp_path), tmp_path / "out"
    both, arrived = threading.Barrier(2, timeout=120), []
    complete = NotebookExecutionManager.cell_complete

    def cell_complete(self, cell, *args, **kwargs):
        result = complete(self, cell, *args, **kwargs)
        if "injected-parameters" in cell.metadata.get("tags", []):
            arrived.append(1)
            if len(arrived) <= 2 and both.wait() == 0:    # the second of the first two
                os.kill(os.getpid(), signal.SIGUSR1)
        return result

    monkeypatch.setattr(NotebookExecutionManager, "cell_complete", cell_complete)
    argv = [str(profile), "--outputs", str(out), "--per-device", "2", "--no-report"]
    assert batch.main(argv) == 75
    text = capsys.readouterr().out
    assert ("stopped by SIGUSR1: 2 run(s) preempted with a checkpoint, 2 not started; 0 ok, "
            "0 failed. Rerun the same command to resume (exit 75)") in text
    records = [json.loads(p.read_text()) for p in (out / "runs").glob("*/metrics.json")]
    assert [r["status"] for r in records] == ["preempted"] * 2
    assert all(r["preempted"]["checkpoint"] and r["preempted"]["step"] >= 1 for r in records)
    monkeypatch.setattr(NotebookExecutionManager, "cell_complete", complete)
    assert batch.main(argv) == 0
    assert "4 ok, 0 skipped, 0 failed" in capsys.readouterr().out
    same_runs(out, serial, comparable)


def test_a_chains_points_never_run_at_once(tmp_path):
    """A point that reads another's run folder waits for it, in its slot, while the other
    slot runs an independent point meanwhile (no kernels: the points are stand-ins)."""
    points = batch.load_profile("smoke", str(tmp_path)).points
    first = RunConfig.from_dict(points[0])
    grid = [points[0], points[1], {**points[3], "reuse_labels_from": str(run_dir_of(first))}]
    assert [len(c) for c in grids.chains(grid)] == [2, 1]
    seen = {}

    def run(point, kernels):
        start = time.monotonic()
        time.sleep(0.3)
        seen[RunConfig.from_dict(point).run_id] = (start, time.monotonic())
        return "ok", ""

    work = pool.Batch(batch.load_profile("smoke", str(tmp_path)), grid, {}, run)
    assert pool.run_all(work, None, per_device=2, fresh=False, lock_wait_s=0)
    (a0, a1), (b0, b1), (c0, c1) = (seen[RunConfig.from_dict(p).run_id] for p in grid)
    assert c0 >= a1                       # the chain: after the point it reads
    assert b0 < a1 and a0 < b1            # the other slot: at the same time
    assert work.counts["ok"] == 3


def test_per_device_is_a_profile_key_and_a_checked_flag(tmp_path, capsys):
    path = write_profile(tmp_path, "per_device: 3\ngrid:\n  task: RTE\n")
    assert batch.load_profile(str(path)).per_device == 3
    assert batch.load_profile("smoke").per_device == 1
    for bad in ("0", "two", "true"):
        (tmp_path / "bad.yaml").write_text(f"per_device: {bad}\ngrid: {{}}\n")
        with pytest.raises(ConfigError, match="`per_device` must be a whole number >= 1"):
            batch.load_profile(str(tmp_path / "bad.yaml"))
    with pytest.raises(SystemExit):
        batch.main(["smoke", "--per-device", "0"])
    frozen = yaml.safe_load(grids.frozen(batch.load_profile(str(path)))[0])
    assert frozen["per_device"] == 3                   # a SLURM task's grid keeps it


@pytest.mark.parametrize("where", ["flag", "profile", "frozen"])
@pytest.mark.parametrize("spread", [["--processes", "2"], ["--nodes", "2", "--rdzv", "h:1"]])
def test_one_rule_for_k_wherever_it_is_set(tmp_path, capsys, where, spread):
    """K > 1 with --processes / --nodes is refused in one line, exit 2, before anything runs,
    whether K came from the command line, the profile or a SLURM task's frozen grid."""
    path = write_profile(tmp_path, f"per_device: {1 if where == 'flag' else 2}\n"
                                   "grid:\n  task: synthetic\n  model: tiny\n")
    if where == "frozen":
        (tmp_path / "frozen.yaml").write_text(grids.frozen(batch.load_profile(str(path)))[0])
        path = tmp_path / "frozen.yaml"
    flag = ["--per-device", "2"] if where == "flag" else []
    assert batch.main([str(path), *flag, *spread, "--outputs", str(tmp_path / "out")]) == 2
    source = "--per-device" if where == "flag" else f"per_device in {path}"
    assert capsys.readouterr().err == (
        f"error: per_device 2 ({source}) runs several points on one device; --processes and "
        "--nodes run one point on several: choose one\n")
    assert not (tmp_path / "out" / "runs").exists()


def test_k_points_label_their_lines_and_an_oom_says_k_shared_the_device(tmp_path, capsys):
    import io
    stream = io.StringIO()
    labelled = kkernels.Labelled(stream, "[2/4] ")
    for part in ("epoch 1/2 train: 3/7", "\rDONE\nnext", " line\n"):
        labelled.write(part)
    assert stream.getvalue() == "[2/4] epoch 1/2 train: 3/7\r[2/4] DONE\n[2/4] next line\n"
    points, labels = batch.load_profile("smoke", str(tmp_path)).points[:2], []

    def run(point, kernels):
        labels.append(kernels.label)
        return "failed", "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    work = pool.Batch(batch.load_profile("smoke", str(tmp_path)), points, {}, run)
    assert pool.run_all(work, None, per_device=2, fresh=False, lock_wait_s=0)
    assert sorted(labels) == ["[1/2] ", "[2/2] "]
    assert ("CUDA out of memory. Tried to allocate 2.00 GiB; 2 points shared the device "
            "(--per-device 2): fewer at once may fit") in capsys.readouterr().out


def test_a_slots_own_error_still_ends_with_the_summary(tmp_path, monkeypatch, capsys):
    """A slot whose kernel manager breaks (the batch's bug): the other slot takes its points,
    and the batch ends with its summary and report lines, exit 1."""
    path = write_profile(tmp_path, "per_device: 2\nreport: false\ngrid:\n  task: synthetic\n"
                                   "  model: tiny\n  seed: [0, 1, 2]\n")
    made = []

    class Broken(kkernels.Kernels):
        def __enter__(self):
            made.append(self)
            if len(made) == 2:              # the second slot's kernel: the batch's own bug
                raise RuntimeError("kernel manager broke")
            return self
    monkeypatch.setattr(pool, "Kernels", Broken)
    monkeypatch.setattr(batch, "execute", lambda profile, point, *a: ("ok", ""))
    monkeypatch.setattr(batch.profile_outputs, "write", lambda *a, **k: None)
    assert batch.main([str(path), "--outputs", str(tmp_path / "out")]) == 1
    out = capsys.readouterr().out.splitlines()
    assert "3 ok, 0 skipped, 0 failed" in out[-2]
    assert out[-1] == (f"profile p: ssa-kit slot 1: RuntimeError: kernel manager broke (a bug of "
                       "the batch, not of a point; its traceback is above)")


def test_threads_per_point_share_the_cores_unless_set(monkeypatch):
    from kit.train.accel import cpu_threads
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert pool.threads_per_point(2) == str(cpu_threads(2))
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert pool.threads_per_point(2) == "3"
