"""A profile on a SLURM cluster: a job array whose task i of N runs shard i/N of the grid, or one
job of several nodes that runs every point on all of them.

    ./run_all.sh slurm PROFILE [--only KEY=V1,V2 ...] [--array N] [--max-parallel K] [--nodes N] [--time T]
        [--partition P] [--account A] [--gpus-per-task G] [--cpus-per-task C] [--processes N]
        [--signal-grace S] [--max-requeues R] [--sbatch 'LINE' ...] [--outputs DIR] [--dry-run]

The grid is frozen at submission (kit.config.grids: OUTPUTS/slurm/grid-<hash>/<profile>.yaml,
which the tasks read instead of the live YAML; a shard takes whole chains), the script written
to OUTPUTS/slurm/<profile>.sbatch and sbatch'ed (--dry-run prints it and submits nothing).
SLURM sends SIGUSR1 to a task's shell GRACE s before its time limit; the shell passes it to the
batch, whose point checkpoints, exits 75, and is requeued (at most R times). docs/cluster.md.
The script itself is kit.cluster.slurm_script's; here are the options, checked, and sbatch.
"""
from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

from kit import io as kio
from kit.cluster import costs
from kit.cluster.overhead import NOT_PROBED
from kit.cluster.pool import refuse_mixed
from kit.cluster.signals import DEFAULT_GRACE_S
from kit.cluster.slurm_script import DEFAULT_REQUEUES, DEFAULT_TASKS_CAP, EARLY_S, Array, script
from kit.config.grids import chains, frozen
from kit.config.paths import outputs_root
from kit.config.profiles import load_profile, profile_path
from kit.config.run_config import ConfigError, RunConfig
from kit.data.readers import DataError
from kit.models.backbones import ModelError



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


def check(args: argparse.Namespace, points: int, units: int) -> None:
    """One line for each option SLURM would reject or that would waste tasks; `units`: the
    grid's chains, which a task takes whole."""
    if args.nodes > 1 and (args.array is not None or args.max_parallel is not None):
        raise ConfigError(f"--nodes {args.nodes}: one job runs every point on all nodes; "
                          "--array and --max-parallel are for one-node tasks")
    args.array = args.array if args.array is not None else min(units, DEFAULT_TASKS_CAP)
    chained = "" if units == points else f" in {units} chain(s) (a point that reads another's " \
                                         "output runs in its task)"
    if not 1 <= args.array <= units:
        raise ConfigError(f"--array {args.array}: the profile has {points} grid point(s)"
                          f"{chained}, so 1 to {units} tasks (a task without a point would "
                          "do nothing)")
    for option in ("partition", "account"):
        value = getattr(args, option)
        if value is not None and not NAME.fullmatch(value):
            raise ConfigError(f"--{option} {value!r}: expected a name (letters, digits, "
                              "'.', '_', '-'; several comma-separated)")
    if args.gpus_per_task is not None and not GPUS.fullmatch(args.gpus_per_task):
        raise ConfigError(f"--gpus-per-task {args.gpus_per_task!r}: expected a count, or "
                          "TYPE:COUNT such as a100:1")
    for option, least in (("cpus_per_task", 1), ("processes", 1), ("signal_grace", 1),
                          ("max_parallel", 1), ("nodes", 1), ("max_requeues", 0)):
        value = getattr(args, option)
        if value is not None and value < least:
            raise ConfigError(f"--{option.replace('_', '-')} {value}: must be >= {least}")
    if args.signal_grace > 65535:              # SLURM's limit for --signal's time
        raise ConfigError(f"--signal-grace {args.signal_grace}: at most 65535 s")
    if args.time is not None and args.signal_grace + EARLY_S >= time_limit_s(args.time):
        raise ConfigError(f"--signal-grace {args.signal_grace} s: SLURM may send the signal up "
                          f"to {EARLY_S} s earlier, so --time {args.time} must be longer than "
                          f"{args.signal_grace + EARLY_S} s (or a task is warned as it starts)")


class _Parser(argparse.ArgumentParser):
    def error(self, message):      # one line, as every kit error (argparse adds a usage block)
        raise ConfigError(message)


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="./run_all.sh slurm", description=__doc__.splitlines()[0])
    p.add_argument("profile", help="a name in params/ (smoke, glue-small ...) or a YAML path")
    p.add_argument("--only", action="append", default=[], metavar="KEY=V1,V2",
                   help="only the grid's points whose KEY is one of the values, e.g. "
                        "task=RTE,MRPC (repeatable; the whole profile's run ids)")
    p.add_argument("--array", type=int, help="tasks in the array (default: one per chain of "
                   f"the grid, at most {DEFAULT_TASKS_CAP}); task i runs chains i, i+N ...")
    p.add_argument("--max-parallel", type=int, metavar="K", help="at most K tasks at once")
    p.add_argument("--nodes", type=int, default=1, help="N > 1: one job on N nodes, every "
                   "point on all of them (kit.batch --nodes)")
    p.add_argument("--time", help="each task's time limit, HH:MM:SS (or SLURM's D-HH:MM:SS); "
                   "default: the plan's (./run_all.sh plan: the longest task's predicted time, "
                   "with --nodes N the whole grid's with each point split over the N nodes, with "
                   "a margin); the plan also gives --mem and --cpus-per-task")
    p.add_argument("--partition", help="the partition (sbatch --partition)")
    p.add_argument("--account", help="the account the job is charged to (sbatch --account)")
    p.add_argument("--gpus-per-task", help="a count, or TYPE:COUNT")
    p.add_argument("--cpus-per-task", type=int)
    p.add_argument("--processes", type=int, default=1, help="each run data-parallel on N "
                   "processes (kit.batch --processes)")
    p.add_argument("--signal-grace", type=int, default=DEFAULT_GRACE_S, metavar="S",
                   help="SIGUSR1 this many seconds before the time limit: the running point "
                        f"checkpoints and the task requeues (default {DEFAULT_GRACE_S})")
    p.add_argument("--max-requeues", type=int, default=DEFAULT_REQUEUES, metavar="R",
                   help=f"requeue a task at most R times (default {DEFAULT_REQUEUES})")
    p.add_argument("--sbatch", action="append", default=[], metavar="LINE",
                   help="an extra sbatch option, e.g. '--mem=16G' (repeatable)")
    p.add_argument("--outputs", default=str(outputs_root()))
    p.add_argument("--dry-run", action="store_true", help="print (and write) the script, "
                   "submit nothing")
    return p


def _joined(argv: list[str]) -> list[str]:
    """`--sbatch --mem=8G` as `--sbatch=--mem=8G`: argparse would take the value for an option."""
    out, words = [], iter(argv)
    for word in words:
        out.append(f"--sbatch={next(words, '')}" if word == "--sbatch" else word)
    return out


def array_of(argv: list[str] | None) -> tuple[Array, str, bool, list[str]]:
    """The options checked (one-line ConfigError) into an Array, the frozen grid's text,
    --dry-run and the lines saying where --time, --mem and --cpus-per-task came from, before
    anything is written."""
    args = parser().parse_args(_joined(sys.argv[1:] if argv is None else argv))
    outputs = Path(args.outputs).resolve()
    profile = load_profile(args.profile, str(outputs), args.only)
    check(args, len(profile.points), len(chains(profile.points)))
    # every task's batch would refuse it as it starts (and be requeued): refused here, unqueued
    refuse_mixed(profile.per_device, args.processes, args.nodes, f"per_device in {profile.path}")
    extra = [sbatch_line(line) for line in args.sbatch]
    result, whence = planned(profile, args)
    said = []
    if args.time is None:
        args.time, line = planned_time(result, whence, args, profile)
        said.append(line)
    mem, line = resources(result, whence, args, profile.per_device, extra)
    said += [line] * bool(line)
    text, digest = frozen(profile)
    grid = outputs / "slurm" / f"grid-{digest}" / profile_path(args.profile).name
    return Array(str(grid), profile.name, args.array, outputs, args.time, args.partition,
                 args.gpus_per_task, args.cpus_per_task, args.processes, args.signal_grace,
                 extra, max_parallel=args.max_parallel, nodes=args.nodes,
                 max_requeues=args.max_requeues, account=args.account, mem=mem), \
        text, args.dry_run, said


def planned(profile, args: argparse.Namespace) -> tuple[dict | None, str]:
    """The plan the request comes from, and whence: the plan `./run_all.sh plan` saved for
    this very grid (kit.plan.saved_path) on the kind of device the tasks ask for (a GPU node's
    for --gpus-per-task); else, without --time, a plan of this machine made now (its batch's
    own start and end not probed: the margin holds them); else None. Refused where the tasks
    ask for GPUs, no GPU plan was saved and this machine has no GPU (its plan would time the
    wrong device), or where no plan can be made."""
    from kit import plan
    kept = plan.saved(profile, Path(args.outputs))
    if kept and (kept["slurm"]["gpus_per_task"] > 0) == bool(args.gpus_per_task):
        return kept, (f"the plan saved at {plan.saved_path(profile, Path(args.outputs))} "
                      f"({kept['device']}, {kept.get('made', '?')}")
    if args.time is not None:
        return None, ""
    from kit.train.accel import machine_device
    if args.gpus_per_task and machine_device() != "cuda":
        raise ConfigError(f"--gpus-per-task {args.gpus_per_task} without --time: no plan of "
                          f"this grid made on a GPU is saved, and this machine has none; run "
                          f"./run_all.sh plan {profile.name} (the same --only and --outputs) on "
                          f"a GPU node, or pass --time")
    try:
        # a batch's own start and end (kit.cluster.overhead, ~10 s to measure) sit well inside
        # --time's margin: not probed here, where every submission would pay for it
        result = plan.plan(profile, profile.per_device, budget_s=1.0, overhead=NOT_PROBED)
    except (ModelError, DataError) as err:
        raise ConfigError(f"no --time given and no plan to take it from ({err})") from None
    return result, f"./run_all.sh plan ({result['device']}, made now"


def planned_time(result: dict, whence: str, args: argparse.Namespace,
                 profile) -> tuple[str, str]:
    """--time from the plan, and the line that says so: the longest task's points one after
    another; with --nodes N the whole grid, each point split over the N nodes."""
    from kit import plan
    tasks = [[RunConfig.from_dict(p).run_id for p in chain] for chain in chains(profile.points)]
    if args.nodes > 1:
        groups = [[run for chain in tasks for run in chain]]
        what = f"the whole grid on {args.nodes} nodes (each point's training and evaluation " \
               "split between them)"
    else:
        groups = [[run for chain in tasks[i::args.array] for run in chain]
                  for i in range(args.array)]
        what = f"the longest of {args.array} task(s)"
    time, longest = plan.task_time(result, groups, args.nodes)
    return time, (f"--time {time}: from {whence}: {what} {plan.duration(longest)}, "
                  f"{plan.MARGIN_TEXT}); --time T overrides it")


GPU_TASK_CPUS = 8


def resources(result: dict | None, whence: str, args: argparse.Namespace, per_device: int,
              extra: list[str]) -> tuple[str | None, str]:
    """--mem from the plan (None: none, or an --sbatch '--mem...' given) and --cpus-per-task
    (set in args where not given), and the line that says so ("" for neither): each of the K
    points a task runs at once, or of one point's N processes, holds a model and the threads
    it was timed on."""
    from kit import plan
    if not result:
        return None, ""
    workers = max(per_device, args.processes)
    at_once = f" x {workers} at once" if workers > 1 else ""
    parts = []
    mem = None
    if result.get("probes") and not any(line.startswith("--mem") for line in extra):
        mem = costs.task_memory(result["probes"], plan.MARGIN, workers)
        parts.append(f"--mem {mem} (a point's peak memory{at_once}, x{plan.MARGIN} + 2 GiB, "
                     "at least 4)")
    if "threads" in result and args.cpus_per_task is None:
        # beside a GPU a point's host work (batches, launches) needs a few cores: a GPU node's
        # plan times on all of its cores, and asking for them all would run one task a node
        capped = bool(args.gpus_per_task) and result["threads"] > GPU_TASK_CPUS
        args.cpus_per_task = (GPU_TASK_CPUS if capped else result["threads"]) * workers
        cap = f", at most {GPU_TASK_CPUS} beside a GPU" if capped else ""
        parts.append(f"--cpus-per-task {args.cpus_per_task} (the threads a point was timed "
                     f"on{cap}{at_once})")
    return mem, (f"{', '.join(parts)}: from {whence}); --sbatch '--mem=M' and --cpus-per-task "
                 "C override them" if parts else "")


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
        array, grid, dry_run, said = array_of(argv)
        text = script(array)
        # the frozen grid, named by its content: an edited profile submitted again gets a
        # grid of its own, and tasks still queued keep theirs; its folder holds the logs
        if not Path(array.profile).exists():
            kio.write_text(array.profile, grid)
        kio.write_text(array.script_path, text)
        if dry_run:
            print(text + f"# (dry run: nothing submitted; sbatch {array.script_path} submits it)"
                  + "".join(f"\n# {line}" for line in said))
            return 0
        job = submit(array.script_path)
    except (ConfigError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    logs = str(array.log_pattern).replace("%A", job).replace("%j", job).replace("%a", "*")
    shape = f"job {job}: {array.nodes} nodes" if array.nodes > 1 else \
        f"job array {job}: {array.tasks} task(s)"
    for line in said:
        print(line)
    print(f"submitted {shape} of profile {array.name}; logs {logs}; watch: squeue -j {job}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
