"""A profile as a SLURM job array: one sbatch script whose task i of N runs `--shard i/N`.

    ./run_all.sh slurm PROFILE [--array N] [--time T] [--partition P] [--gpus-per-task G]
        [--cpus-per-task C] [--processes N] [--signal-grace S] [--sbatch 'LINE' ...]
        [--outputs DIR] [--dry-run]

The script is written to OUTPUTS/slurm/<profile>.sbatch and submitted with sbatch (--dry-run
prints it and submits nothing). Every task runs its slice of the grid (`./run_all.sh PROFILE
--shard i/N`: points i, i+N, i+2N ...) into the one outputs folder the tasks share. SLURM sends
SIGUSR1 to a task's shell GRACE seconds before its time limit; the shell passes it to the batch,
whose running point finishes its step, checkpoints mid-epoch and exits 75; the shell then
requeues its own task, which resumes that point where it stopped. docs/cluster.md says more.
"""
from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from kit import io as kio
from kit.config.profiles import REPO, load_profile, profile_path
from kit.config.run_config import ConfigError

DEFAULT_TASKS_CAP = 100     # a default array this size stays under most clusters' job limits
DEFAULT_GRACE_S = 120       # a checkpoint of a large model on a busy filesystem, with margin
PREEMPTED_EXIT = 75         # kit.batch's "stopped on a signal, requeue me" (EX_TEMPFAIL)


@dataclass
class Array:
    """What the script asks SLURM for and what each task runs."""
    profile: str            # a name in params/ or an absolute YAML path
    name: str               # the profile's name: the job name and the file names
    tasks: int
    outputs: Path           # absolute: the tasks start in the project, wherever sbatch ran
    time: str | None = None
    partition: str | None = None
    gpus_per_task: str | None = None
    cpus_per_task: int | None = None
    processes: int = 1
    grace_s: int = DEFAULT_GRACE_S
    extra: list[str] = field(default_factory=list)
    project: Path = REPO

    @property
    def script_path(self) -> Path:
        return self.outputs / "slurm" / f"{self.name}.sbatch"

    @property
    def log_pattern(self) -> Path:       # %A: the array's job id, %a: the task's index
        return self.outputs / "slurm" / f"{self.name}-%A_%a.log"


# ---------------------------------------------------------------- the script

def directives(array: Array) -> list[str]:
    """The #SBATCH lines: the array, its log (appended to, so a requeued task's second part
    follows its first), requeue allowed, SIGUSR1 to the shell GRACE s before the time limit."""
    lines = [f"--job-name=ssa-kit-{array.name}", f"--array=0-{array.tasks - 1}",
             f"--output={array.log_pattern}", "--open-mode=append", "--requeue",
             f"--signal=B:USR1@{array.grace_s}"]
    optional = {"time": array.time, "partition": array.partition,
                "gpus-per-task": array.gpus_per_task, "cpus-per-task": array.cpus_per_task}
    lines += [f"--{key}={value}" for key, value in optional.items() if value is not None]
    return [f"#SBATCH {line}" for line in lines + array.extra]


def batch_command(array: Array) -> str:
    """What a task runs: its shard of the grid, into the shared outputs folder."""
    words = ["./run_all.sh", shlex.quote(array.profile),
             "--shard", f'"$SLURM_ARRAY_TASK_ID/{array.tasks}"',
             "--outputs", shlex.quote(str(array.outputs))]
    if array.processes > 1:
        words += ["--processes", str(array.processes)]
    return " ".join(words)


HEAD = """\
#!/bin/bash
# ssa-kit: profile {name} as a SLURM job array of {tasks} task(s), written by `./run_all.sh slurm`
# (kit/slurm.py). Task i runs grid points i, i+{tasks}, i+{twice} ... into {outputs}, which all
# tasks share (a lock per run). SIGUSR1 comes {grace} s before the time limit: the running point
# checkpoints and the task is requeued to resume it (docs/cluster.md).
"""

BODY = """\
cd {project} || exit 1
# this task by its array name: one task's own SLURM_JOB_ID is also the array's id, and
# `scontrol requeue` of that id would requeue every task
task="${{SLURM_ARRAY_JOB_ID}}_${{SLURM_ARRAY_TASK_ID}}"
echo "ssa-kit: task $task, shard $SLURM_ARRAY_TASK_ID/{tasks}," \\
  "start $((SLURM_RESTART_COUNT + 1)) on $(hostname) at $(date '+%F %T')"

# the batch runs in the background so that this shell can take SLURM's signals and pass them
# on; the traps come first, so no signal finds this shell without them
batch="" warned=""
trap 'warned=yes; kill -USR1 $batch 2>/dev/null' USR1
trap 'kill -TERM $batch 2>/dev/null' TERM
# a background job ignores SIGINT: it is passed on as SIGTERM, which the batch treats alike
trap 'kill -TERM $batch 2>/dev/null' INT
{command} &
batch=$!
# a trapped signal ends `wait` early: wait again until the batch itself has exited
while kill -0 $batch 2>/dev/null; do wait $batch; done
wait $batch
status=$?

# {preempted}: the batch stopped on a signal and its point checkpointed. After SIGUSR1 (the time
# limit's warning, or `scancel --signal=USR1 --batch`) this task is requeued and resumes that
# point. Not after SIGTERM alone: that is scancel (a requeue would undo it) or a preemption
# that SLURM requeues by itself.
if [ $status -eq {preempted} ] && [ -n "$warned" ]; then
  echo "ssa-kit: task $task stopped on SIGUSR1 and checkpointed; requeueing it"
  scontrol requeue "$task" || echo "ssa-kit: requeue refused; sbatch {script} again" \\
    "(finished points are skipped, the stopped one resumes)"
fi
echo "ssa-kit: task $task exits $status at $(date '+%F %T')"
exit $status
"""


def script(array: Array) -> str:
    head = HEAD.format(name=array.name, tasks=array.tasks, twice=2 * array.tasks,
                       outputs=array.outputs, grace=array.grace_s)
    body = BODY.format(project=shlex.quote(str(array.project)), tasks=array.tasks,
                       command=batch_command(array), preempted=PREEMPTED_EXIT,
                       script=shlex.quote(str(array.script_path)))
    return head + "\n".join(directives(array)) + "\n\n" + body


# ---------------------------------------------------------------- options

TIME = re.compile(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?")
NAME = re.compile(r"[\w.-]+(,[\w.-]+)*")
GPUS = re.compile(r"(\w+:)?[1-9]\d*")


def time_limit_s(text: str) -> int:
    """SLURM's time formats in seconds: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S."""
    match = TIME.fullmatch(text)
    if not match:
        raise ConfigError(f"--time {text!r}: expected HH:MM:SS (or SLURM's M, M:S, D-HH, "
                          "D-HH:MM, D-HH:MM:SS)")
    days, *rest = match.groups()
    numbers = [int(n) for n in rest if n is not None]
    if days is not None:                       # D-H[:M[:S]]
        hours, minutes, seconds = (numbers + [0, 0])[:3]
        return ((int(days) * 24 + hours) * 60 + minutes) * 60 + seconds
    if len(numbers) == 3:                      # H:M:S
        return (numbers[0] * 60 + numbers[1]) * 60 + numbers[2]
    return numbers[0] * 60 + (numbers[1] if len(numbers) == 2 else 0)    # M[:S]


def sbatch_line(text: str) -> str:
    """`--mem=8G` or `#SBATCH --mem=8G` -> the option, checked to be one option line."""
    line = text.strip().removeprefix("#SBATCH").strip()
    if not line.startswith("-") or "\n" in line:
        raise ConfigError(f"--sbatch {text!r}: expected one sbatch option, e.g. --sbatch "
                          "'--mem=16G'")
    return line


def check(args: argparse.Namespace, points: int) -> None:
    """One line for each option SLURM would reject or that would waste tasks."""
    if not 1 <= args.array <= points:
        raise ConfigError(f"--array {args.array}: the profile has {points} grid point(s), so "
                          f"1 to {points} tasks (a task without a point would do nothing)")
    if args.partition is not None and not NAME.fullmatch(args.partition):
        raise ConfigError(f"--partition {args.partition!r}: expected a partition name")
    if args.gpus_per_task is not None and not GPUS.fullmatch(args.gpus_per_task):
        raise ConfigError(f"--gpus-per-task {args.gpus_per_task!r}: expected a count, or "
                          "TYPE:COUNT such as a100:1")
    for option in ("cpus_per_task", "processes", "signal_grace"):
        value = getattr(args, option)
        if value is not None and value < 1:
            raise ConfigError(f"--{option.replace('_', '-')} {value}: must be >= 1")
    if args.signal_grace > 65535:              # SLURM's limit for --signal's time
        raise ConfigError(f"--signal-grace {args.signal_grace}: at most 65535 s")
    if args.time is not None and args.signal_grace >= time_limit_s(args.time):
        raise ConfigError(f"--signal-grace {args.signal_grace} s: not shorter than --time "
                          f"{args.time}, so every task would be warned as it starts")


class _Parser(argparse.ArgumentParser):
    def error(self, message):      # one line, as every kit error (argparse adds a usage block)
        raise ConfigError(message)


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="./run_all.sh slurm", description=__doc__.splitlines()[0])
    p.add_argument("profile", help="a name in params/ (smoke, glue-small ...) or a YAML path")
    p.add_argument("--array", type=int, help="tasks in the array (default: one per grid point, "
                   f"at most {DEFAULT_TASKS_CAP}); task i runs points i, i+N, i+2N ...")
    p.add_argument("--time", help="each task's time limit, HH:MM:SS (or SLURM's D-HH:MM:SS)")
    p.add_argument("--partition")
    p.add_argument("--gpus-per-task", help="a count, or TYPE:COUNT")
    p.add_argument("--cpus-per-task", type=int)
    p.add_argument("--processes", type=int, default=1,
                   help="each run data-parallel on N processes (kit.batch --processes)")
    p.add_argument("--signal-grace", type=int, default=DEFAULT_GRACE_S, metavar="S",
                   help="SIGUSR1 this many seconds before the time limit: the running point "
                        f"checkpoints and the task requeues (default {DEFAULT_GRACE_S})")
    p.add_argument("--sbatch", action="append", default=[], metavar="LINE",
                   help="an extra sbatch option, e.g. '--mem=16G' (repeatable)")
    p.add_argument("--outputs", default=os.environ.get("SSA_KIT_OUTPUTS", "outputs"))
    p.add_argument("--dry-run", action="store_true", help="print the script, submit nothing")
    return p


def _joined(argv: list[str]) -> list[str]:
    """`--sbatch --mem=8G` as `--sbatch=--mem=8G`: argparse would take the value for an option."""
    out, words = [], iter(argv)
    for word in words:
        out.append(f"--sbatch={next(words, '')}" if word == "--sbatch" else word)
    return out


def array_of(argv: list[str] | None) -> tuple[Array, bool]:
    """The options checked (one-line ConfigError) into an Array, before anything is written."""
    args = parser().parse_args(_joined(sys.argv[1:] if argv is None else argv))
    outputs = Path(args.outputs).resolve()
    profile = load_profile(args.profile, str(outputs))
    points = len(profile.points)
    args.array = args.array if args.array is not None else min(points, DEFAULT_TASKS_CAP)
    check(args, points)
    path = profile_path(args.profile)
    # a name in params/ stays a name; a YAML elsewhere is named by its absolute path, since
    # the tasks start in the project folder
    name_or_path = args.profile if path == REPO / "params" / f"{args.profile}.yaml" \
        else str(path.resolve())
    extra = [sbatch_line(line) for line in args.sbatch]
    return Array(name_or_path, profile.name, args.array, outputs, args.time, args.partition,
                 args.gpus_per_task, args.cpus_per_task, args.processes, args.signal_grace,
                 extra), args.dry_run


# ---------------------------------------------------------------- submit

def submit(path: Path) -> str:
    """sbatch the script; returns the array's job id."""
    if shutil.which("sbatch") is None:
        raise OSError(f"sbatch not found: this machine is no SLURM login node; the script is "
                      f"written, submit it where SLURM runs: sbatch {path}")
    done = subprocess.run(["sbatch", "--parsable", str(path)], capture_output=True, text=True)
    if done.returncode != 0:
        reason = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        raise OSError(f"sbatch {path}: {reason}")
    return done.stdout.strip().split(";")[0]          # "jobid[;cluster]"


def main(argv: list[str] | None = None) -> int:
    try:
        array, dry_run = array_of(argv)
        text = script(array)
        if dry_run:
            print(text, end="")
            return 0
        kio.write_text(array.script_path, text)      # its folder holds the tasks' logs too
        job = submit(array.script_path)
    except (ConfigError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    logs = str(array.log_pattern).replace("%A", job).replace("%a", "*")
    print(f"submitted job array {job}: {array.tasks} task(s) of profile {array.name}; "
          f"logs {logs}; watch: squeue -j {job}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
