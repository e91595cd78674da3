"""SLURM (kit.slurm): the scripts `./run_all.sh slurm PROFILE` writes (a job array, or one job of
several nodes), its options and one-line errors, the grid frozen at submission and cut into
chains (kit.config.grids), the scripts' signal forwarding and requeue, capped (bash with a
stand-in batch and srun), one set-up at a time in run_all.sh, and a real single-node SLURM
(tests/slurm/start-cluster.sh) running the smoke grid as a 2-task array, its profile edited
after submission, one task preempted mid-epoch: requeued and resumed to the run it would have
been, every point of the grid as submitted run once."""
import contextlib
import io
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from kit import batch, runs, slurm
from kit.config import grids
from kit.config.profiles import load_profile
from kit.config.run_config import RunConfig

REPO = Path(__file__).resolve().parents[1]
START = REPO / "tests" / "slurm" / "start-cluster.sh"
PACKAGES = "apt-get install slurm-wlm munge"


# --time given where the plan is not what a test is about (kit.slurm would probe for it)
TIME = ["--time", "01:00:00"]

def dry_run(*options: str, outputs: Path) -> SimpleNamespace:
    """`./run_all.sh slurm OPTIONS --outputs OUTPUTS` in this process (a new one costs a second
    of imports): its exit status, stdout and stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = slurm.main([*options, "--outputs", str(outputs)])
    return SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())


# ---------------------------------------------------------------- the script

def frozen_grid(text: str) -> Path:
    """The frozen grid a script's tasks run (its --shard or --nodes command names it)."""
    return Path(re.search(r"\./run_all\.sh (\S+/grid-\w+/[\w.-]+\.yaml) ", text)[1])


def test_dry_run_prints_the_array_script_and_submits_nothing(tmp_path):
    done = dry_run("smoke", "--array", "3", "--time", "02:00:00", "--partition", "gpu",
                   "--gpus-per-task", "a100:1", "--cpus-per-task", "8", "--processes", "2",
                   "--signal-grace", "300", "--max-parallel", "2", "--max-requeues", "5",
                   "--sbatch", "--mem=16G", "--sbatch", "#SBATCH --qos=low", "--dry-run",
                   outputs=tmp_path / "out")
    assert done.returncode == 0, done.stderr
    text, out = done.stdout, tmp_path / "out"
    directives = [line.removeprefix("#SBATCH ") for line in text.splitlines()
                  if line.startswith("#SBATCH ")]
    assert directives == [
        "--job-name=ssa-kit-smoke", "--array=0-2%2", f"--output={out}/slurm/smoke-%A_%a.log",
        "--open-mode=append", "--requeue", "--signal=B:USR1@300", "--time=02:00:00",
        "--partition=gpu", "--gpus-per-task=a100:1", "--cpus-per-task=8", "--mem=16G",
        "--qos=low"]
    assert text.startswith("#!/bin/bash\n")
    grid = frozen_grid(text)
    assert f'./run_all.sh {grid} --shard "$SLURM_ARRAY_TASK_ID/3" --outputs {out} ' \
           f"--processes 2 --signal-grace 300 &" in text
    assert f"cd {REPO} " in text
    assert "[ $status -eq 75 ]" in text and '"${SLURM_RESTART_COUNT:-0}" -ge 5 ]' in text
    assert 'scontrol requeue "$task"' in text and 'task="${SLURM_ARRAY_JOB_ID}_' in text
    # nothing submitted; written: the script and the grid it names, in its log folder, so that
    # it can be submitted later as it is
    assert sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file()) == [
        Path("slurm") / grid.parent.name / "smoke.yaml", Path("slurm/smoke.sbatch")]
    assert (out / "slurm" / "smoke.sbatch").read_text() + \
        f"# (dry run: nothing submitted; sbatch {out}/slurm/smoke.sbatch submits it)\n" == text
    assert grid.parent.parent == out / "slurm"
    frozen = load_profile(str(grid), str(out))
    assert frozen.name == "smoke" and frozen.points == load_profile("smoke", str(out)).points


def test_dry_run_of_a_job_on_two_nodes(tmp_path):
    """--nodes 2: one job (no array) whose shell runs srun of the batch on every node in the
    background, the nodes meeting on the first one at a port of the job's own; bash parses it."""
    done = dry_run("smoke", "--nodes", "2", "--processes", "4", "--gpus-per-task", "4",
                   "--time", "1-00:00:00", "--dry-run", outputs=tmp_path / "out")
    assert done.returncode == 0, done.stderr
    text, out = done.stdout, tmp_path / "out"
    assert [line for line in text.splitlines() if line.startswith("#SBATCH ")] == [
        "#SBATCH --job-name=ssa-kit-smoke", "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --output={out}/slurm/smoke-%j.log", "#SBATCH --open-mode=append",
        "#SBATCH --requeue", "#SBATCH --signal=B:USR1@120", "#SBATCH --time=1-00:00:00",
        "#SBATCH --gpus-per-task=4"]
    assert text.splitlines()[1] == "# ssa-kit: profile smoke as one job on 2 nodes"
    assert 'head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)' in text
    assert (f'srun --ntasks-per-node=1 ./run_all.sh {frozen_grid(text)} --nodes 2 --rdzv '
            f'"$head:$port" --outputs {out} --processes 4 --signal-grace 120 &') in text
    assert 'scontrol requeue "$task"' in text and 'task="$SLURM_JOB_ID"' in text
    script = tmp_path / "job.sh"
    script.write_text(text)
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0


# ---------------------------------------------------------------- the grid, frozen in chains

def test_a_frozen_grid_is_the_profile_as_submitted(tmp_path):
    """Shipped profiles frozen and read back: the same points, in the same order, under the same
    name - task_overrides applied (demo, powered-cpu), a list value as one value (multitask's
    `tasks`), `{outputs}` (tapt-cpu), a CSV task (kaggle-stsb), lists of grids (families, gamma).
    (paper-grid's 3024 points would cost 10 s for nothing more.)"""
    for name in ("demo", "powered-cpu", "multitask", "tapt-cpu", "kaggle-stsb", "families",
                 "gamma", "smoke"):
        path = REPO / "params" / f"{name}.yaml"
        profile = load_profile(str(path), str(tmp_path))
        text, digest = grids.frozen(profile)
        frozen = tmp_path / digest / path.name
        frozen.parent.mkdir()
        frozen.write_text(text)
        again = load_profile(str(frozen), str(tmp_path))
        assert again.name == profile.name and again.points == profile.points, path.name


def test_tasks_run_the_grid_as_submitted_not_the_profile_edited_since(tmp_path):
    """The profile edited while the array waits in the queue (a point added in front, one
    removed): every task's shard, read from the frozen grid, is what it was at submission."""
    profile = tmp_path / "mine.yaml"
    profile.write_text((REPO / "params" / "smoke.yaml").read_text())
    out = tmp_path / "out"
    done = dry_run(str(profile), "--array", "2", "--dry-run", *TIME, outputs=out)
    before = [grids.shard_points(load_profile(str(profile), str(out)).points, f"{i}/2")
              for i in (0, 1)]
    smoke = yaml.safe_load(profile.read_text())
    smoke["grid"] = [{**smoke["grid"], "method": "ssa-h", "seed": 7},
                     {**smoke["grid"], "method": ["bert", "ssa-co"]}]
    profile.write_text(yaml.safe_dump(smoke))
    grid = str(frozen_grid(done.stdout))
    after = [grids.shard_points(load_profile(grid, str(out)).points, f"{i}/2") for i in (0, 1)]
    assert after == before and [len(s) for s in before] == [2, 2]
    live = [grids.shard_points(load_profile(str(profile), str(out)).points, f"{i}/2")
            for i in (0, 1)]
    assert live != before                    # what a task reading the live YAML would run


def ids(points) -> list[str]:
    return [RunConfig.from_dict(p).run_id for p in points]


def test_a_point_that_reads_another_points_output_runs_after_it_in_its_task():
    """tapt-smoke: fine-tuning reads the masked-LM point's adapted/ folder, so both are one
    chain: the default array is one task, --shard 0/1 runs them in order. tapt-cpu: each
    adapted model's fine-tuning points are in its pretraining's shard, after it (2 and 5 shards)."""
    smoke = load_profile("tapt-smoke").points
    assert [len(c) for c in grids.chains(smoke)] == [2]
    assert ids(grids.shard_points(smoke, "0/1")) == ids(smoke)
    cpu = load_profile("tapt-cpu").points
    chains = grids.chains(cpu)
    pretrain = [p for p in cpu if p["method"] == "mlm"]
    assert len(cpu) == 39 and len(chains) == 4 + 15 and len(pretrain) == 4
    for n in (2, 5):
        shards = [[id(p) for p in grids.shard_points(cpu, f"{i}/{n}")] for i in range(n)]
        assert sorted(sum(shards, [])) == sorted(map(id, cpu))          # each point once
        for point in pretrain:
            users = [id(p) for p in cpu if p["model"] == point["adapted_dir"]]
            mine = next(s for s in shards if id(point) in s)
            assert len(users) == 5 and all(u in mine for u in users)
            assert all(mine.index(u) > mine.index(id(point)) for u in users)


def test_a_grid_without_such_points_is_sharded_as_before_and_a_run_folder_chains_too(tmp_path):
    """No point reads another's output: shard i/n is points i, i+n ... A point whose
    reuse_labels_from names another point's run folder joins that point's chain."""
    points = load_profile("smoke").points
    for n in (1, 2, 3, len(points)):
        assert [ids(grids.shard_points(points, f"{i}/{n}")) for i in range(n)] == [
            ids(points[i::n]) for i in range(n)]
    first = RunConfig.from_dict(points[0])
    reuse = {**points[3], "reuse_labels_from": str(runs.run_dir_of(first))}
    assert [len(c) for c in grids.chains([points[0], points[1], reuse])] == [2, 1]


@pytest.mark.parametrize("where,before,finished,why", [
    ({"step": 30, "checkpoint": "c"}, 14, 0, None),                   # it got further
    ({"step": 14, "checkpoint": "c"}, 14, 0, "no progress in this start: no point finished; r1 "
                                             "is at step 14, as the last start left it"),
    ({"step": 14, "checkpoint": "c"}, 14, 1, None),                   # another point finished
    ({}, None, 0, "no progress in this start: no point finished"),    # stopped before training
    ({"step": 9, "checkpoint": None}, None, 2, "r1 was preempted at step 9 without a "
                                                "checkpoint to resume from"),
    ({"step": 0, "checkpoint": None}, None, 1, None),   # trained nothing, lost nothing
])
def test_a_stop_that_a_rerun_would_repeat_is_told_apart(where, before, finished, why):
    got = grids.stuck("r1", where, before, finished)
    assert got == why if why is None else got.startswith(why), got


def test_the_default_array_is_one_task_per_chain(tmp_path):
    profile = tmp_path / "mine.yaml"
    profile.write_text((REPO / "params" / "smoke.yaml").read_text())
    done = subprocess.run([sys.executable, "-m", "kit.slurm", "mine.yaml", "--dry-run", *TIME],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "#SBATCH --array=0-3\n" in done.stdout                # smoke: 4 points
    grid = frozen_grid(done.stdout)
    assert grid.parent.parent == tmp_path / "outputs" / "slurm" and grid.name == "mine.yaml"
    assert f"--outputs {tmp_path / 'outputs'} " in done.stdout
    tapt = dry_run("tapt-smoke", "--dry-run", *TIME, outputs=tmp_path / "out")
    assert "#SBATCH --array=0-0\n" in tapt.stdout              # 2 points, 1 chain


@pytest.mark.parametrize("options,needle", [
    (["--array", "0"], "--array 0: the profile has 4 grid point(s), so 1 to 4 tasks"),
    (["--array", "9"], "--array 9"),
    (["--array", "two"], "argument --array: invalid int value: 'two'"),
    (["--time", "2h"], "--time '2h': expected HH:MM:SS"),
    (["--time", "00:03:00"], "--signal-grace 120 s: SLURM may send the signal up to 60 s "
                             "earlier, so --time 00:03:00 must be longer than 180 s"),
    (["--max-parallel", "0"], "--max-parallel 0: must be >= 1"),
    (["--max-requeues", "-1"], "--max-requeues -1: must be >= 0"),
    (["--nodes", "2", "--array", "2"], "--nodes 2: one job runs every point on all nodes"),
    (["--signal-grace", "0"], "--signal-grace 0: must be >= 1"),
    (["--gpus-per-task", "all"], "--gpus-per-task 'all'"),
    (["--partition", "a b"], "--partition 'a b'"),
    (["--account", "a b"], "--account 'a b': expected a name"),
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
    tapt = dry_run("tapt-smoke", "--array", "2", outputs=tmp_path / "out")
    assert tapt.returncode == 2 and tapt.stderr.count("\n") == 1
    assert "--array 2: the profile has 2 grid point(s) in 1 chain(s)" in tapt.stderr


@pytest.mark.parametrize("text,seconds", [
    ("90", 5400), ("90:30", 5430), ("02:00:00", 7200), ("1-0", 86400), ("1-2:30", 95400),
    ("1-02:30:15", 95415)])
def test_time_limits_in_slurm_formats(text, seconds):
    assert slurm.time_limit_s(text) == seconds


def test_without_sbatch_the_script_is_written_and_the_error_is_one_line(tmp_path):
    env = {**os.environ, "PATH": str(Path(sys.executable).parent)}     # python, no sbatch
    done = subprocess.run([sys.executable, "-m", "kit.slurm", "smoke", *TIME, "--outputs",
                           str(tmp_path / "out")], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=60)
    script = tmp_path / "out" / "slurm" / "smoke.sbatch"
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "sbatch not found" in done.stderr and f"sbatch {script}" in done.stderr
    assert script.read_text().startswith("#!/bin/bash\n")


# ------------------------------------------- the scripts' signals, with a stand-in batch

STAND_IN = """#!/bin/bash
# the batch's contract: exit 75 once a signal stopped it and its point checkpointed (3 if a
# rerun would get no further: $EXIT)
echo "$@" > args
sleep 60 &
trap 'kill $!; exit ${EXIT:-75}' USR1 TERM
touch started
wait
"""
# srun's part on one node: its task in the background, USR1 and TERM passed on, its status
SRUN = """#!/bin/bash
while [[ "$1" == --* ]]; do shift; done
"$@" &
task=$!
trap 'kill -USR1 $task' USR1
trap 'kill -TERM $task' TERM
while kill -0 $task 2>/dev/null; do wait $task; done
wait $task
"""


def executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o755)


@pytest.mark.parametrize("nodes", [1, 2], ids=["array", "nodes"])
@pytest.mark.parametrize("sent,exit_code,restarts,requeued,says", [
    # the time limit's warning, or scancel --signal=USR1 --batch
    (signal.SIGUSR1, 75, 0, True, "stopped on SIGUSR1 and checkpointed; requeueing it"),
    (signal.SIGTERM, 75, 0, False, ""),         # scancel: a requeue would undo it
    (signal.SIGINT, 75, 0, False, ""),          # passed on as SIGTERM (a background job ignores it)
    # requeued 3 times already (--max-requeues 3): stop, whatever the batch says
    (signal.SIGUSR1, 75, 3, False, "stopped on SIGUSR1 after 3 requeue(s) (--max-requeues): "
                                   "not requeued; sbatch"),
    (signal.SIGUSR1, 3, 0, False, ""),           # the batch made no progress: no requeue
])
def test_the_script_passes_signals_on_and_requeues_after_sigusr1_at_most_r_times(
        tmp_path, nodes, sent, exit_code, restarts, requeued, says):
    """The job's shell (an array task's, or a job on several nodes whose shell runs srun) passes
    the signal to the batch and requeues its own task only after SIGUSR1, when the batch exits 75
    and the task was requeued fewer than --max-requeues times (SLURM_RESTART_COUNT)."""
    executable(tmp_path / "run_all.sh", STAND_IN)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    executable(bin_dir / "srun", SRUN)
    executable(bin_dir / "scontrol", f'#!/bin/sh\nif [ "$1" = show ]; then echo node1; echo '
                                     f'node2; else echo "$@" >> {tmp_path}/scontrol; fi\n')
    array = slurm.Array("grid.yaml", "smoke", 2 if nodes == 1 else 1, tmp_path / "out",
                        project=tmp_path, nodes=nodes)
    (tmp_path / "job.sh").write_text(slurm.script(array))
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "41",
           "SLURM_RESTART_COUNT": str(restarts), "EXIT": str(exit_code),
           **({"SLURM_ARRAY_JOB_ID": "41", "SLURM_ARRAY_TASK_ID": "1"} if nodes == 1
              else {"SLURM_JOB_NODELIST": "node[1-2]"})}
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
    assert job.returncode == exit_code, out
    assert (tmp_path / "args").read_text().split() == (
        ["grid.yaml", "--shard", "1/2"] if nodes == 1 else
        ["grid.yaml", "--nodes", "2", "--rdzv", "node1:20041"]) + [
        "--outputs", str(tmp_path / "out"), "--signal-grace", "120"]
    calls = (tmp_path / "scontrol").read_text() if (tmp_path / "scontrol").exists() else ""
    task = "41_1" if nodes == 1 else "41"                   # this task, not the whole array
    assert calls == (f"requeue {task}\n" if requeued else "")
    assert (says in out) and ("requeueing it" in out) == requeued, out
    unit = "task" if nodes == 1 else "job"
    assert f"ssa-kit: {unit} {task} exits {exit_code} at " in out.splitlines()[-1], out


def test_concurrent_set_ups_of_one_project_take_turns(tmp_path):
    """The tasks of an array start ./run_all.sh together on one shared .venv: its set-up runs
    one at a time (a lock beside the venv), or two pip installs would write one venv at once.
    A stand-in venv's python logs each set-up check (0.3 s); none may overlap another."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    executable(venv / "bin" / "python", f"""#!/bin/bash
if [ "$1" = -c ]; then
  echo "$(date +%s.%N) $(sleep 0.3; date +%s.%N)" >> {tmp_path}/checks
fi
""")
    runs_ = [subprocess.Popen(["bash", str(REPO / "run_all.sh"), "doctor"],
                              env={**os.environ, "VENV": str(venv)}) for _ in range(2)]
    assert [p.wait(timeout=60) for p in runs_] == [0, 0]
    spans = sorted(tuple(map(float, line.split()))
                   for line in (tmp_path / "checks").read_text().splitlines())
    assert len(spans) == 4                         # two checks per set-up
    assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:])), spans


def test_set_up_goes_on_unlocked_where_the_filesystem_has_no_locks(tmp_path):
    """Lustre mounted `noflock` fails flock: set-up says so in one line and goes on (under
    `set -e` a failed flock would end every task in its set-up)."""
    venv, bin_ = tmp_path / "venv", tmp_path / "bin"
    (venv / "bin").mkdir(parents=True)
    bin_.mkdir()
    executable(venv / "bin" / "python", f"#!/bin/bash\necho \"$1\" >> {tmp_path}/calls\n")
    executable(bin_ / "flock", "#!/bin/bash\necho 'flock: 9: Function not implemented' >&2\n"
                               "exit 1\n")
    done = subprocess.run(["bash", str(REPO / "run_all.sh"), "doctor"], capture_output=True,
                          text=True, timeout=60, env={**os.environ, "VENV": str(venv),
                                                      "PATH": f"{bin_}:{os.environ['PATH']}"})
    assert done.returncode == 0, done.stderr
    assert done.stderr == ("flock: 9: Function not implemented\nset-up: no file lock on this "
                           "filesystem (flock failed); going on unlocked\n")
    # the set-up's two checks, then the command itself
    assert (tmp_path / "calls").read_text().splitlines() == ["-c", "-c", "-m"]


# ------------------------------------------------------------ a real single-node SLURM

KEEP = "SSA_KIT_KEEP_SLURM"     # =1: the daemons the tests started stay up for the next run


def _start_scheduler() -> tuple[str | None, bool]:
    """(why there is no scheduler, or None; whether start-cluster.sh started any daemon)."""
    path = f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin"
    missing = [b for b in ("sbatch", "squeue", "scontrol", "scancel", "slurmctld", "slurmd",
                           "munged") if shutil.which(b, path=path) is None]
    if missing:
        return f"SLURM is not installed ({', '.join(missing)} not found): {PACKAGES}", False
    done = subprocess.run([str(START)], capture_output=True, text=True, timeout=180)
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines() or [f"exit {done.returncode}"]
        return f"the test SLURM did not start: {lines[-1]}", True
    return None, "SLURM up" in done.stdout         # silent when everything was running


@pytest.fixture(scope="session")
def slurm_cluster(shared_tmp):
    """A one-node SLURM on this machine, started by tests/slurm/start-cluster.sh if it is not
    running, and stopped again when the last test worker using it ends, if a worker of this run
    started it (SSA_KIT_KEEP_SLURM=1 keeps it: a test of the next run finds it up). Workers
    (pytest -n 2) take turns through a lock and count their users in a file beside it, so that
    two never start daemons at once and none stops them under another's jobs. Missing, it skips
    the test, except in CI (CI=true), where it fails."""
    from filelock import FileLock
    lock, users = FileLock(shared_tmp / "slurm.lock"), shared_tmp / "slurm-users.json"
    with lock:
        state = json.loads(users.read_text()) if users.exists() else {"users": 0, "started": False}
        why, started = _start_scheduler()
        state = {"users": state["users"] + 1, "started": state["started"] or started}
        users.write_text(json.dumps(state))
    try:
        if why and os.environ.get("CI") == "true":
            pytest.fail(why)
        if why:
            pytest.skip(why)
        yield
    finally:
        with lock:
            state = json.loads(users.read_text())
            state["users"] -= 1
            if state["users"] == 0 and state["started"] and os.environ.get(KEEP) != "1":
                subprocess.run([str(START), "--stop"], capture_output=True, timeout=120)
                state["started"] = False
            users.write_text(json.dumps(state))


def _wait(condition, timeout: float, what: str, every: float = 0.05) -> float:
    """Poll `condition` every `every` s until it holds; returns when it did (time.monotonic())."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} not within {timeout:.0f}s"
        time.sleep(every)
    return time.monotonic()


def _queued(job: str) -> bool:
    """The array has a task pending, running or completing (finished jobs leave squeue)."""
    done = subprocess.run(["squeue", "-h", "-o", "%F"], capture_output=True, text=True)
    return done.returncode != 0 or job in done.stdout.split()      # an unanswered query: wait


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def test_a_preempted_array_task_is_requeued_and_resumes_to_the_uninterrupted_run(
        slurm_cluster, tmp_path, comparable, batch_kernel):
    """The smoke grid (its 4 methods) as a 2-task array on the real scheduler (--max-parallel 2:
    SLURM takes the throttle), its profile edited right after submission (points reordered, one
    added): the tasks run the grid as submitted. Task 1 runs ssa-co, then bert (a longer run
    that checkpoints every 8 steps); once bert has written a checkpoint inside its second epoch,
    the task gets SIGUSR1 (`scancel --signal=USR1 --batch`, as SLURM's --signal sends it): the
    point checkpoints mid-epoch, recording SIGUSR1, the batch exits 75, the task requeues itself
    (start 2 reads the frozen grid too), skips ssa-co and resumes bert. Every run id of the
    submitted grid once, all ok, and the resumed bert's metrics those of that point run without
    SLURM, uninterrupted (that warm and fresh kernels agree on the others: test_batch.py)."""
    from kit.train.run_state import epoch_dir

    smoke = yaml.safe_load((REPO / "params" / "smoke.yaml").read_text())
    grid = smoke["grid"]
    assert sorted(grid["method"]) == ["bert", "bert-mask", "ssa-co", "ssa-h"]
    # points 0-2 as in smoke, point 3 (task 1's second) bert with 38 steps per epoch; 3 epochs,
    # so that the signal sent at epoch 2's first checkpoint lands with 74 steps to go, not 36: a
    # fast CPU ran 36 tiny steps before it arrived
    smoke["grid"] = [{**grid, "method": ["bert-mask", "ssa-co", "ssa-h"]},
                     {**grid, "method": "bert", "synthetic_size": 600, "epochs": 3,
                      "batch_size": 16, "checkpoint_steps": 8}]
    smoke["report"] = False
    profile = tmp_path / "slurm-smoke.yaml"
    profile.write_text(yaml.safe_dump(smoke))
    resumed_alone = tmp_path / "alone" / profile.name     # the same profile name: the same run id
    resumed_alone.parent.mkdir()
    resumed_alone.write_text(yaml.safe_dump({**smoke, "grid": [smoke["grid"][-1]]}))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}    # the same float sums in every process
    array_out, plain_out = tmp_path / "array", tmp_path / "plain"
    points = load_profile(str(profile), str(array_out)).points
    bert = runs.run_dir_of(RunConfig.from_dict(points[3]))
    assert points[3]["method"] == "bert" and points[1]["method"] == "ssa-co"

    submitted = subprocess.run(
        [sys.executable, "-m", "kit.slurm", str(profile), "--array", "2", "--max-parallel", "2",
         *TIME,
         "--outputs", str(array_out)], cwd=REPO, env=env, capture_output=True, text=True,
        timeout=60)
    assert submitted.returncode == 0, submitted.stderr
    job = re.search(r"submitted job array (\d+)", submitted.stdout)[1]
    # edited while the tasks wait or run: read live, task 1 would run other points
    profile.write_text(yaml.safe_dump({**smoke, "grid": [
        {**grid, "method": "ssa-h", "seed": 1}, *reversed(smoke["grid"])]}))
    logs = [array_out / "slurm" / f"slurm-smoke-{job}_{i}.log" for i in (0, 1)]
    try:
        # a checkpoint inside epoch 2 (0-based 1) exists: bert is 2 steps into it, 74 to go.
        # The folder is looked for every 0.05 s, the queue (a process and a request to
        # slurmctld, on the cores the tasks run on) every 0.5 s
        polls = itertools.count(1)
        _wait(lambda: epoch_dir(bert, 1).is_dir() or (next(polls) % 10 == 0 and not _queued(job)),
              300, "bert's epoch 2")
        assert _queued(job), _read(logs[1])
        subprocess.run(["scancel", "--signal=USR1", "--batch", f"{job}_1"], check=True)
        # the resumed point without SLURM, uninterrupted, in this worker's warm kernel (one
        # thread, as the tasks' kernels: the same float sums), while task 1 stops, waits to be
        # requeued and starts again
        assert batch.run_profile(str(resumed_alone), outputs_dir=str(plain_out)) == 0
        _wait(lambda: not _queued(job), 300, "the array's end", every=0.25)
    finally:                                        # nothing left running after a failure
        subprocess.run(["scancel", job], capture_output=True)

    other, preempted = _read(logs[0]), _read(logs[1])
    for log in (preempted, other):                  # each task's last start ended well
        assert log.rstrip().splitlines()[-1].startswith(f"ssa-kit: task {job}_"), log
        assert " exits 0 at " in log.rstrip().splitlines()[-1], log
    assert "stopped by SIGUSR1: 1 run(s) preempted with a checkpoint" in preempted, preempted
    assert re.search(r"bert seed=0 model=tiny: preempted \(stopped by SIGUSR1 at epoch [23]",
                     preempted), preempted
    assert "Rerun the same command to resume (exit 75)" in preempted, preempted     # kit.batch
    assert "stopped on SIGUSR1 and checkpointed; requeueing it" in preempted, preempted
    # the requeue took (SLURM's SIGTERM ends scontrol with the job): no "refused" said
    assert "requeue refused" not in preempted, preempted
    second_start = preempted.partition(", start 2 on ")[2]     # SLURM ran it again
    assert re.search(r"resumed from a mid-epoch checkpoint: epoch [23]/3", second_start), preempted
    assert "resumed from" not in other and "requeueing" not in other, other
    ids = sorted(RunConfig.from_dict(p).run_id for p in points)
    assert sorted(d.name for d in runs.run_folders(runs.runs_root(array_out))) == ids
    assert all(runs.read_metrics(runs.runs_root(array_out) / i)["status"] == "ok" for i in ids)
    [alone] = runs.run_folders(runs.runs_root(plain_out))
    assert alone.name == bert.name
    want = runs.read_metrics(alone)
    assert want["status"] == "ok" and comparable(runs.read_metrics(bert)) == comparable(want)


# ------------------------------------------------ docs/cluster.md's recipe, walked

def recipe_data(n: int, seed: int) -> dict:
    """A GLUE pair task's hub columns (the hub's class ids, -1 where a split hides them): `n`
    rows of one seeded pattern, learnable or not - the walk checks the commands, not scores."""
    import random
    rng = random.Random(seed)
    words = ["cat", "dog", "sun", "rain", "tree", "car", "book", "sea"]
    rows = [(" ".join(rng.choices(words, k=6)), " ".join(rng.choices(words, k=5)))
            for _ in range(n)]
    return {"sentence1": [a for a, _ in rows], "sentence2": [b for _, b in rows],
            "label": [rng.randrange(2) for _ in rows], "idx": list(range(n))}


def recipe_hub(name, config, split):
    """datasets.load_dataset for nyu-mll/glue's rte and mrpc, as ./run_all.sh fetch calls it."""
    from test_fetch import FakeSplit
    names = {"rte": ["entailment", "not_entailment"], "mrpc": ["not_equivalent", "equivalent"]}
    data = recipe_data({"train": 48, "validation": 16, "test": 16}[split], len(split))
    if split == "test":
        data["label"] = [-1] * len(data["idx"])
    return FakeSplit(data, names[config])


def recipe_profile(folder: Path, model: str) -> Path:
    """params/paper-base.yaml as the recipe runs it, made seconds-cheap: the cached tiny model,
    BERT-r and SSA-H, one seed, one epoch, short rows; its name and `paper: base` kept."""
    spec = yaml.safe_load((REPO / "params" / "paper-base.yaml").read_text())
    spec["grid"].update(model=model, method=["bert", "ssa-h"], seed=0, epochs=1, batch_size=16,
                        max_length=32, lr=1.0e-3)
    spec["report"] = False
    path = folder / "paper-base.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_the_cluster_recipe(slurm_cluster, tmp_path, monkeypatch):
    """docs/cluster.md's opening recipe on the one-node SLURM: setup -> fetch (the hub faked:
    RTE and MRPC into a GLUE folder, a tiny model into a fresh HF cache) -> plan -> slurm of
    paper-base --only task=RTE,MRPC with the plan's --time -> report with the paper's rows,
    every step after fetch with HF_HUB_OFFLINE=1."""
    from kit import fetch
    from kit.data import hub
    # the plan's own probes of the recipe's points, less its batch probe (test_fetch.py says why):
    # slurm takes --time from what it saves
    from test_fetch import PLAN_WITHOUT_BATCH_PROBE, cached_model
    hf_home, glue, outputs = tmp_path / "hf", tmp_path / "glue", tmp_path / "out"
    model = "kit-test/tiny-bert"
    env = {**os.environ, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1", "GLUE_DIR": str(glue),
           "OMP_NUM_THREADS": "1", "VENV": sys.prefix}
    setup = subprocess.run(["bash", str(REPO / "run_all.sh"), "setup"], env=env,
                           capture_output=True, text=True, timeout=300)
    assert setup.returncode == 0 and setup.stdout.startswith("set-up done: "), setup.stderr
    monkeypatch.setattr(hub, "hub_unreachable", lambda timeout_s=3.0: None)   # the login node
    monkeypatch.setenv("HF_HOME", str(hf_home))
    assert fetch.main(["RTE", "MRPC", "--model", model, "--glue-dir", str(glue)],
                      load=recipe_hub,
                      download=lambda repo, allow_patterns: str(cached_model(hf_home, repo,
                                                                              weights=True))) == 0
    profile = recipe_profile(tmp_path, model)
    only = ["--only", "task=RTE,MRPC"]
    planned = subprocess.run([sys.executable, "-c", PLAN_WITHOUT_BATCH_PROBE, str(profile),
                              *only, "--json", "--budget", "0.3", "--outputs", str(outputs)],
                             cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert planned.returncode == 0, planned.stderr
    plan = json.loads(planned.stdout)
    assert sorted(p["label"] for p in plan["points"]) == [
        "MRPC bert s0", "MRPC ssa-h s0", "RTE bert s0", "RTE ssa-h s0"]
    assert {p["data"] for p in plan["points"]} == {str(glue)}
    # one CPU a task, not the plan's every CPU of this machine: their runs take one thread
    # (OMP_NUM_THREADS=1), and the test node (each CPU shared by up to 4 jobs: start-cluster.sh)
    # then runs all four at once, beside the other test's array
    submitted = subprocess.run([sys.executable, "-m", "kit.slurm", str(profile), *only,
                                "--cpus-per-task", "1", "--outputs", str(outputs)], cwd=REPO,
                               env=env, capture_output=True, text=True, timeout=300)
    assert submitted.returncode == 0, submitted.stderr
    # the plan above was saved for this grid: slurm takes its --time, no second probing
    assert re.search(r"^--time \S+: from the plan saved at \S+/plans/paper-base-\w+\.json \(",
                     submitted.stdout, re.M), submitted.stdout
    job = re.search(r"submitted job array (\d+): 4 task\(s\)", submitted.stdout)[1]
    try:
        _wait(lambda: not _queued(job), 600, "the array's end", every=0.25)
    finally:
        subprocess.run(["scancel", job], capture_output=True)
    ids = sorted(p["run_id"] for p in plan["points"])
    assert sorted(d.name for d in runs.run_folders(runs.runs_root(outputs))) == ids
    for run in ids:
        metrics = runs.read_metrics(runs.runs_root(outputs) / run)
        assert metrics["status"] == "ok" and metrics["data_source"].startswith(str(glue))
    report = subprocess.run([sys.executable, "-m", "kit.batch", str(profile), "--report-only",
                             *only, "--outputs", str(outputs)], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=600)
    assert report.returncode == 0, report.stderr
    [table] = (outputs / "tables").rglob("paper-base-results.md")
    assert "BERT-r (paper)" in table.read_text() and "SSA-H (paper)" in table.read_text()


def test_slurm_takes_its_time_from_the_plan_saved_for_the_same_grid(tmp_path):
    """`./run_all.sh plan` on a GPU node saves its plan under the grid's digest; `slurm
    --gpus-per-task 1` on the login node (no GPU) takes --time from it and says whence. A
    grid no GPU plan was saved for is refused in one line there, naming the way out."""
    from kit import plan
    outputs = tmp_path / "out"
    profile = load_profile("smoke", str(outputs))
    path = plan.saved_path(profile, outputs)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({
        "device": "NVIDIA H200 (bf16)", "made": "2026-11-28T10:00:00+00:00",
        "points": [{"run_id": RunConfig.from_dict(p).run_id, "seconds": 100.0}
                   for p in profile.points],
        "total": {"once_s": 20.0}, "slurm": {"gpus_per_task": 1}}))
    done = dry_run("smoke", "--gpus-per-task", "1", "--dry-run", outputs=outputs)
    assert done.returncode == 0, done.stderr
    # 4 chains, a task each: (20 + 100) x 1.5 + 600 = 780 s
    assert "#SBATCH --time=00:13:00\n" in done.stdout
    assert (f"# --time 00:13:00: from the plan saved at {path} (NVIDIA H200 (bf16), "
            "2026-11-28T10:00:00+00:00: the longest of 4 task(s) 2.0 min, x1.5 + 10 min); "
            "--time T overrides it") in done.stdout
    other = dry_run("smoke", "--only", "method=bert", "--gpus-per-task", "1", "--dry-run",
                    outputs=outputs)
    assert other.returncode == 2 and other.stderr.count("\n") == 1, other.stderr
    assert ("no plan of this grid made on a GPU is saved, and this machine has none; run "
            "./run_all.sh plan smoke (the same --only and --outputs) on a GPU node, or pass "
            "--time") in other.stderr


# ------------------------------------------- what a submission asks for, from the plan

H200 = {"device": "NVIDIA H200 (bf16)", "made": "2026-11-28T10:00:00+00:00"}
GIB = 1024 ** 3


def saved_plan(outputs: Path, profile_name: str, point: dict, **plan_keys) -> Path:
    """A plan of the profile's grid as `./run_all.sh plan` on an H200 saves it: every point
    `point` (its seconds and their parts), a batch's once_s of 20 s."""
    from kit import plan
    profile = load_profile(profile_name, str(outputs))
    path = plan.saved_path(profile, outputs)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        **H200, "points": [{"run_id": RunConfig.from_dict(p).run_id, **point}
                           for p in profile.points],
        "total": {"once_s": 20.0}, "slurm": {"gpus_per_task": 1}, **plan_keys}))
    return path


def sbatch_lines(text: str, *options: str) -> list[str]:
    return [line for line in text.splitlines()
            if line.startswith(tuple(f"#SBATCH {o}" for o in options))]


@pytest.mark.parametrize("nodes,time,what", [
    # an array: 4 chains, a task each, one point's 1 h: (20 + 3600) x 1.5 + 600 = 6030 s
    (1, "01:40:30", "the longest of 4 task(s) 60.3 min"),
    # one job runs all 4 points on both nodes, each point's 3400 s of training and evaluation
    # split between them: (20 + 4 x (200 + 3400 / 2)) x 1.5 + 600 = 12030 s
    (2, "03:20:30", "the whole grid on 2 nodes (each point's training and evaluation split "
                    "between them) 2.1 h"),
    (4, "01:55:30", "the whole grid on 4 nodes (each point's training and evaluation split "
                    "between them) 70.3 min")])      # (20 + 4 x (200 + 850)) x 1.5 + 600 = 6930 s
def test_a_job_on_n_nodes_asks_for_the_time_of_the_whole_grid_split_over_them(
        tmp_path, nodes, time, what):
    out = tmp_path / "out"
    path = saved_plan(out, "smoke", {"seconds": 3600.0, "train_s": 3000.0, "eval_s": 400.0,
                                     "prepare_s": 150.0, "checkpoint_s": 50.0})
    done = dry_run("smoke", "--nodes", str(nodes), "--gpus-per-task", "1", "--dry-run",
                   outputs=out)
    assert done.returncode == 0, done.stderr
    assert sbatch_lines(done.stdout, "--time") == [f"#SBATCH --time={time}"]
    assert (f"# --time {time}: from the plan saved at {path} (NVIDIA H200 (bf16), "
            f"2026-11-28T10:00:00+00:00: {what}, x1.5 + 10 min); --time T overrides it\n"
            in done.stdout), done.stdout


PROBE = {"device": "cuda:0", "model_bytes": GIB, "peak_memory_bytes": 3 * GIB}


@pytest.mark.parametrize("options,lines", [
    # host memory beside a GPU: 4 x the model's 1 GiB, x1.5 + 2 GiB; the probes' 8 threads
    ([], ["#SBATCH --cpus-per-task=8", "#SBATCH --mem=8G"]),
    # one point on 2 processes: each holds the model and its threads
    (["--processes", "2"], ["#SBATCH --cpus-per-task=16", "#SBATCH --mem=14G"]),
    # the user's own, --time given: the saved plan still gives what the user did not
    (["--cpus-per-task", "4", "--time", "02:00:00"], ["#SBATCH --cpus-per-task=4",
                                                      "#SBATCH --mem=8G"]),
    (["--sbatch", "--mem=32G", "--time", "02:00:00"], ["#SBATCH --cpus-per-task=8",
                                                       "#SBATCH --mem=32G"])])
def test_the_plans_memory_and_cpus_reach_the_script(tmp_path, options, lines):
    out = tmp_path / "out"
    saved_plan(out, "smoke", {"seconds": 60.0}, threads=8, probes=[PROBE])
    done = dry_run("smoke", "--gpus-per-task", "1", *options, "--dry-run", outputs=out)
    assert done.returncode == 0, done.stderr
    assert sbatch_lines(done.stdout, "--cpus-per-task", "--mem") == lines


@pytest.mark.parametrize("options,cpus", [([], 8), (["--processes", "2"], 16)])
def test_a_gpu_nodes_plan_asks_for_a_few_cores_a_point_not_the_nodes(tmp_path, options, cpus):
    """A plan made on a 64-core GPU node timed its probes on 64 threads: a GPU task asks for
    at most 8 a point, or the array would run one task a node."""
    out = tmp_path / "out"
    saved_plan(out, "smoke", {"seconds": 60.0}, threads=64, probes=[PROBE])
    done = dry_run("smoke", "--gpus-per-task", "1", *options, "--dry-run", outputs=out)
    assert done.returncode == 0, done.stderr
    assert sbatch_lines(done.stdout, "--cpus-per-task") == [f"#SBATCH --cpus-per-task={cpus}"]
    assert "(the threads a point was timed on, at most 8 beside a GPU" in done.stdout


def test_the_line_says_where_memory_and_cpus_came_from_and_k_points_count(tmp_path):
    """A CPU plan of a profile running 2 points at once (per_device: 2): each point's peak
    (3 GiB) and its threads, twice."""
    profile = tmp_path / "pair.yaml"
    profile.write_text((REPO / "params" / "smoke.yaml").read_text() + "per_device: 2\n")
    out = tmp_path / "out"
    path = saved_plan(out, str(profile), {"seconds": 60.0}, threads=4,
                      probes=[{**PROBE, "device": "cpu"}], slurm={"gpus_per_task": 0},
                      device="a CPU (fp32)")
    done = dry_run(str(profile), "--dry-run", outputs=out)
    assert done.returncode == 0, done.stderr
    # 2 x 3 GiB x 1.5 + 2 GiB; 2 x 4 threads
    assert sbatch_lines(done.stdout, "--cpus-per-task", "--mem") == [
        "#SBATCH --cpus-per-task=8", "#SBATCH --mem=11G"]
    assert (f"# --mem 11G (a point's peak memory x 2 at once, x1.5 + 2 GiB, at least 4), "
            f"--cpus-per-task 8 "
            f"(the threads a point was timed on x 2 at once): from the plan saved at {path} "
            "(a CPU (fp32), 2026-11-28T10:00:00+00:00); --sbatch '--mem=M' and "
            "--cpus-per-task C override them\n") in done.stdout


@pytest.mark.parametrize("options", [["--processes", "2"], ["--nodes", "2"]])
def test_k_points_at_once_with_processes_or_nodes_is_refused_before_sbatch(
        tmp_path, monkeypatch, options):
    """per_device 2 with --processes 2: every task's batch would refuse it as it starts; the
    submission refuses it in one line, writes nothing and calls no sbatch."""
    profile = tmp_path / "pair.yaml"
    profile.write_text((REPO / "params" / "smoke.yaml").read_text() + "per_device: 2\n")
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    executable(bin_ / "sbatch", f"#!/bin/bash\necho \"$@\" >> {tmp_path}/sbatch.log\necho 1\n")
    monkeypatch.setenv("PATH", f"{bin_}:{os.environ['PATH']}")
    done = dry_run(str(profile), *options, *TIME, outputs=tmp_path / "out")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == (f"error: per_device 2 (per_device in {profile}) runs several points "
                           "on one device; --processes and --nodes run one point on several: "
                           "choose one\n")
    assert not (tmp_path / "out").exists() and not (tmp_path / "sbatch.log").exists()


def test_account_and_partition_reach_the_script(tmp_path):
    done = dry_run("smoke", "--account", "proj-1", "--partition", "gpu", *TIME, "--dry-run",
                   outputs=tmp_path / "out")
    assert done.returncode == 0, done.stderr
    assert sbatch_lines(done.stdout, "--partition", "--account") == [
        "#SBATCH --partition=gpu", "#SBATCH --account=proj-1"]
