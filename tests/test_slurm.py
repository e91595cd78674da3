"""SLURM job arrays (kit.slurm): the script `./run_all.sh slurm PROFILE` writes, its options and
one-line errors, its signal forwarding and requeue (bash with a stand-in batch), and a real
single-node SLURM (tests/slurm/start-cluster.sh) running the smoke grid as a 2-task array with
one task preempted mid-epoch: requeued, resumed, and the union equal to an unsharded run."""
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from kit import batch, runs, slurm
from kit.config.profiles import load_profile, shard
from kit.config.run_config import RunConfig

REPO = Path(__file__).resolve().parents[1]
START = REPO / "tests" / "slurm" / "start-cluster.sh"
PACKAGES = "apt-get install slurm-wlm munge"


def dry_run(*options: str, outputs: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kit.slurm", *options, "--outputs", str(outputs)],
                          cwd=REPO, capture_output=True, text=True, timeout=60)


# ---------------------------------------------------------------- the script

def test_dry_run_prints_the_array_script_and_writes_nothing(tmp_path):
    done = dry_run("smoke", "--array", "3", "--time", "02:00:00", "--partition", "gpu",
                   "--gpus-per-task", "a100:1", "--cpus-per-task", "8", "--processes", "2",
                   "--signal-grace", "300", "--sbatch", "--mem=16G",
                   "--sbatch", "#SBATCH --qos=low", "--dry-run", outputs=tmp_path / "out")
    assert done.returncode == 0, done.stderr
    text, out = done.stdout, tmp_path / "out"
    directives = [line.removeprefix("#SBATCH ") for line in text.splitlines()
                  if line.startswith("#SBATCH ")]
    assert directives == [
        "--job-name=ssa-kit-smoke", "--array=0-2", f"--output={out}/slurm/smoke-%A_%a.log",
        "--open-mode=append", "--requeue", "--signal=B:USR1@300", "--time=02:00:00",
        "--partition=gpu", "--gpus-per-task=a100:1", "--cpus-per-task=8", "--mem=16G",
        "--qos=low"]
    assert text.startswith("#!/bin/bash\n")
    assert f'./run_all.sh smoke --shard "$SLURM_ARRAY_TASK_ID/3" --outputs {out} ' \
           f"--processes 2 &" in text
    assert f"cd {REPO} " in text
    assert "[ $status -eq 75 ]" in text
    assert 'scontrol requeue "$task"' in text and 'task="${SLURM_ARRAY_JOB_ID}_' in text
    assert not out.exists()                                     # a dry run writes nothing


def test_shard_i_of_n_is_array_task_i_and_the_shards_cover_the_grid_once():
    """SLURM numbers a task 0..N-1 (--array=0-(N-1)); `--shard i/n` takes 0 <= i < n: task i
    runs shard i, and the N shards hold every point exactly once."""
    points = load_profile("smoke").points
    for n in (1, 2, 3, len(points)):
        ids = [RunConfig.from_dict(p).run_id for i in range(n) for p in shard(points, f"{i}/{n}")]
        assert sorted(ids) == sorted(RunConfig.from_dict(p).run_id for p in points)


def test_the_default_array_is_one_task_per_point_and_a_yaml_path_stays_absolute(tmp_path):
    profile = tmp_path / "mine.yaml"
    profile.write_text((REPO / "params" / "smoke.yaml").read_text())
    done = subprocess.run([sys.executable, "-m", "kit.slurm", "mine.yaml", "--dry-run"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "#SBATCH --array=0-3\n" in done.stdout                # smoke: 4 points
    assert f"./run_all.sh {profile} --shard" in done.stdout      # the task starts in the project
    assert f"--outputs {tmp_path / 'outputs'} &" in done.stdout


@pytest.mark.parametrize("options,needle", [
    (["--array", "0"], "--array 0: the profile has 4 grid point(s), so 1 to 4 tasks"),
    (["--array", "9"], "--array 9"),
    (["--array", "two"], "argument --array: invalid int value: 'two'"),
    (["--time", "2h"], "--time '2h': expected HH:MM:SS"),
    (["--time", "00:01:00"], "--signal-grace 120 s: not shorter than --time 00:01:00"),
    (["--signal-grace", "0"], "--signal-grace 0: must be >= 1"),
    (["--gpus-per-task", "all"], "--gpus-per-task 'all'"),
    (["--partition", "a b"], "--partition 'a b'"),
    (["--cpus-per-task", "0"], "--cpus-per-task 0: must be >= 1"),
    (["--sbatch", "mem=4G"], "--sbatch 'mem=4G': expected one sbatch option"),
    (["--mem", "8G"], "unrecognized arguments: --mem 8G"),
])
def test_option_errors_are_one_line_and_write_nothing(tmp_path, options, needle):
    done = dry_run("smoke", *options, outputs=tmp_path / "out")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and needle in done.stderr, done.stderr
    assert not (tmp_path / "out").exists()


def test_an_unknown_profile_is_one_line(tmp_path):
    done = dry_run("nope", outputs=tmp_path / "out")
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "unknown profile 'nope'" in done.stderr


@pytest.mark.parametrize("text,seconds", [
    ("90", 5400), ("90:30", 5430), ("02:00:00", 7200), ("1-0", 86400), ("1-2:30", 95400),
    ("1-02:30:15", 95415)])
def test_time_limits_in_slurm_formats(text, seconds):
    assert slurm.time_limit_s(text) == seconds


def test_without_sbatch_the_script_is_written_and_the_error_is_one_line(tmp_path):
    env = {**os.environ, "PATH": str(Path(sys.executable).parent)}     # python, no sbatch
    done = subprocess.run([sys.executable, "-m", "kit.slurm", "smoke", "--outputs",
                           str(tmp_path / "out")], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=60)
    script = tmp_path / "out" / "slurm" / "smoke.sbatch"
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "sbatch not found" in done.stderr and f"sbatch {script}" in done.stderr
    assert script.read_text().startswith("#!/bin/bash\n")


# ------------------------------------------- the script's signals, with a stand-in batch

STAND_IN = """#!/bin/bash
# the batch's contract: exit 75 once a signal stopped it (its point checkpointed)
echo "$@" > args
sleep 60 &
trap 'kill $!; exit 75' USR1 TERM
touch started
wait
"""


@pytest.mark.parametrize("sent,requeued", [
    (signal.SIGUSR1, True),     # the time limit's warning, or scancel --signal=USR1 --batch
    (signal.SIGTERM, False),    # scancel: a requeue would undo it
    (signal.SIGINT, False),     # passed on as SIGTERM (a background job ignores SIGINT)
])
def test_the_script_passes_signals_to_the_batch_and_requeues_after_sigusr1(tmp_path, sent,
                                                                           requeued):
    (tmp_path / "run_all.sh").write_text(STAND_IN)
    (tmp_path / "run_all.sh").chmod(0o755)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/scontrol\n')
    (bin_dir / "scontrol").chmod(0o755)
    array = slurm.Array("smoke", "smoke", 2, tmp_path / "out", project=tmp_path)
    (tmp_path / "job.sh").write_text(slurm.script(array))
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_ARRAY_JOB_ID": "41",
           "SLURM_ARRAY_TASK_ID": "1", "SLURM_JOB_ID": "41"}
    # as SLURM starts a batch shell: SIGINT not ignored (a pytest-xdist worker ignores it, and
    # a shell cannot trap a signal ignored when it started)
    job = subprocess.Popen(["bash", str(tmp_path / "job.sh")], cwd=tmp_path, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 30
    while not (tmp_path / "started").exists():
        assert job.poll() is None and time.monotonic() < deadline, job.stdout.read()
        time.sleep(0.05)
    job.send_signal(sent)
    out, _ = job.communicate(timeout=30)
    assert job.returncode == 75, out
    assert (tmp_path / "args").read_text().split() == [
        "smoke", "--shard", "1/2", "--outputs", str(tmp_path / "out")]
    calls = (tmp_path / "scontrol").read_text() if (tmp_path / "scontrol").exists() else ""
    assert calls == ("requeue 41_1\n" if requeued else "")          # this task, not the array
    assert ("requeueing it" in out) == requeued


# ------------------------------------------------------------ a real single-node SLURM

def _missing_scheduler() -> str | None:
    path = f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin"
    missing = [b for b in ("sbatch", "squeue", "scontrol", "scancel", "slurmctld", "slurmd",
                           "munged") if shutil.which(b, path=path) is None]
    if missing:
        return f"SLURM is not installed ({', '.join(missing)} not found): {PACKAGES}"
    done = subprocess.run([str(START)], capture_output=True, text=True, timeout=180)
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines() or [f"exit {done.returncode}"]
        return f"the test SLURM did not start: {lines[-1]}"
    return None


@pytest.fixture(scope="session")
def slurm_cluster():
    """A one-node SLURM on this machine, started by tests/slurm/start-cluster.sh if it is not
    running. Missing, it skips the test, except in CI (CI=true), where it fails."""
    why = _missing_scheduler()
    if why and os.environ.get("CI") == "true":
        pytest.fail(why)
    if why:
        pytest.skip(why)


def _wait(condition, timeout: float, what: str) -> float:
    """Poll `condition` until it holds; returns when it did (time.monotonic())."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} not within {timeout:.0f}s"
        time.sleep(0.05)
    return time.monotonic()


def _queued(job: str) -> bool:
    """The array has a task pending, running or completing (finished jobs leave squeue)."""
    done = subprocess.run(["squeue", "-h", "-o", "%F"], capture_output=True, text=True)
    return done.returncode != 0 or job in done.stdout.split()      # an unanswered query: wait


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def test_a_preempted_array_task_is_requeued_resumes_and_the_union_equals_one_run(
        slurm_cluster, tmp_path, comparable, batch_kernel):
    """The smoke grid (its 4 methods) as a 2-task array on the real scheduler. Task 1 runs
    ssa-co, then bert (a longer run that checkpoints every 8 steps); once bert has written a
    checkpoint inside its second epoch, the task gets SIGUSR1 (`scancel --signal=USR1 --batch`,
    as SLURM's --signal sends it): the point checkpoints mid-epoch, the batch exits 75, the task
    requeues itself, skips ssa-co and resumes bert. Every run id once, all ok, each run's
    metrics those of the same grid run unsharded without SLURM."""
    from kit.train.run_state import epoch_dir

    smoke = yaml.safe_load((REPO / "params" / "smoke.yaml").read_text())
    grid = smoke["grid"]
    assert sorted(grid["method"]) == ["bert", "bert-mask", "ssa-co", "ssa-h"]
    # points 0-2 as in smoke, point 3 (task 1's second) bert with 38 steps per epoch
    smoke["grid"] = [{**grid, "method": ["bert-mask", "ssa-co", "ssa-h"]},
                     {**grid, "method": "bert", "synthetic_size": 600, "epochs": 2,
                      "batch_size": 16, "checkpoint_steps": 8}]
    smoke["report"] = False
    profile = tmp_path / "slurm-smoke.yaml"
    profile.write_text(yaml.safe_dump(smoke))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}    # the same float sums in every process
    array_out, plain_out = tmp_path / "array", tmp_path / "plain"
    points = load_profile(str(profile), str(array_out)).points
    bert = runs.run_dir_of(RunConfig.from_dict(points[3]))
    assert points[3]["method"] == "bert" and points[1]["method"] == "ssa-co"

    submitted = subprocess.run(
        [sys.executable, "-m", "kit.slurm", str(profile), "--array", "2", "--outputs",
         str(array_out)], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert submitted.returncode == 0, submitted.stderr
    job = re.search(r"submitted job array (\d+)", submitted.stdout)[1]
    logs = [array_out / "slurm" / f"slurm-smoke-{job}_{i}.log" for i in (0, 1)]
    try:
        # a checkpoint inside epoch 2 (0-based 1) exists: bert is 2 steps into it, 36 to go
        _wait(lambda: epoch_dir(bert, 1).is_dir() or not _queued(job), 300, "bert's epoch 2")
        assert _queued(job), _read(logs[1])
        subprocess.run(["scancel", "--signal=USR1", "--batch", f"{job}_1"], check=True)
        _wait(lambda: not _queued(job), 300, "the array's end")
    finally:                                        # nothing left running after a failure
        subprocess.run(["scancel", job], capture_output=True)
    # the same grid unsharded, without SLURM, in this worker's warm kernel (one thread, as the
    # tasks' kernels: the same float sums)
    assert batch.run_profile(str(profile), outputs_dir=str(plain_out)) == 0

    other, preempted = _read(logs[0]), _read(logs[1])
    for log in (preempted, other):                  # each task's last start ended well
        assert log.rstrip().splitlines()[-1].startswith(f"ssa-kit: task {job}_"), log
        assert " exits 0 at " in log.rstrip().splitlines()[-1], log
    assert "stopped by SIGUSR1: 1 run(s) preempted with a checkpoint" in preempted, preempted
    assert "Rerun the same command to resume (exit 75)" in preempted, preempted     # kit.batch
    assert "stopped on SIGUSR1 and checkpointed; requeueing it" in preempted, preempted
    second_start = preempted.partition(", start 2 on ")[2]     # SLURM ran it again
    assert "resumed from a mid-epoch checkpoint: epoch 2/2" in second_start, preempted
    assert "resumed from" not in other and "requeueing" not in other, other
    ids = sorted(RunConfig.from_dict(p).run_id for p in points)
    assert sorted(d.name for d in runs.run_folders(runs.runs_root(array_out))) == ids
    assert sorted(d.name for d in runs.run_folders(runs.runs_root(plain_out))) == ids
    for run_id in ids:
        got = runs.read_metrics(runs.runs_root(array_out) / run_id)
        want = runs.read_metrics(runs.runs_root(plain_out) / run_id)
        assert got["status"] == want["status"] == "ok", run_id
        assert comparable(got) == comparable(want), run_id
