"""The script a SLURM cluster runs a grid with (kit.slurm writes and submits it): a job array
whose task i runs shard i/N of the frozen grid, or one job of several nodes; its shell passes
SLURM's signals on to the batch and requeues a task that stopped on SIGUSR1 with a checkpoint
(exit PREEMPTED_EXIT), at most --max-requeues times. docs/cluster.md."""
from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path

from kit.cluster.signals import DEFAULT_GRACE_S
from kit.config.profiles import REPO
from kit.train.preemption import PREEMPTED_EXIT

DEFAULT_TASKS_CAP = 100     # a default array this size stays under most clusters' job limits
DEFAULT_REQUEUES = 3        # as submitit's max_num_timeout: a task stopped more often is stuck
EARLY_S = 60                # SLURM sends --signal up to this much earlier than asked


@dataclass
class Array:
    """What the script asks SLURM for and what each task runs (nodes > 1: one job, no array)."""
    profile: str            # the frozen grid's path (any profile name or YAML path runs)
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
    max_parallel: int | None = None
    nodes: int = 1
    max_requeues: int = DEFAULT_REQUEUES
    account: str | None = None
    mem: str | None = None      # sbatch's --mem: per task, or per node of a job of several

    @property
    def script_path(self) -> Path:
        return self.outputs / "slurm" / f"{self.name}.sbatch"

    @property
    def log_pattern(self) -> Path:       # %A: the array's job id, %a: the task's index
        return self.outputs / "slurm" / (f"{self.name}-%j.log" if self.nodes > 1
                                         else f"{self.name}-%A_%a.log")


def directives(array: Array) -> list[str]:
    """The #SBATCH lines: the array (or nodes), its log (appended to: a requeued task's second
    part follows its first), requeue allowed, SIGUSR1 to the shell GRACE s before the limit."""
    throttle = f"%{array.max_parallel}" if array.max_parallel else ""
    shape = ([f"--nodes={array.nodes}", "--ntasks-per-node=1"] if array.nodes > 1
             else [f"--array=0-{array.tasks - 1}{throttle}"])
    lines = [f"--job-name=ssa-kit-{array.name}", *shape, f"--output={array.log_pattern}",
             "--open-mode=append", "--requeue", f"--signal=B:USR1@{array.grace_s}"]
    optional = {"time": array.time, "partition": array.partition, "account": array.account,
                "gpus-per-task": array.gpus_per_task, "cpus-per-task": array.cpus_per_task,
                "mem": array.mem}
    lines += [f"--{key}={value}" for key, value in optional.items() if value is not None]
    return [f"#SBATCH {line}" for line in lines + array.extra]


def batch_command(array: Array) -> str:
    """What a task runs: its shard of the frozen grid (nodes > 1: srun of the whole grid)."""
    words = ["./run_all.sh", shlex.quote(array.profile)]
    if array.nodes > 1:
        words = ["srun", "--ntasks-per-node=1", *words, "--nodes", str(array.nodes),
                 "--rdzv", '"$head:$port"']
    else:
        words += ["--shard", f'"$SLURM_ARRAY_TASK_ID/{array.tasks}"']
    words += ["--outputs", shlex.quote(str(array.outputs))]
    if array.processes > 1:
        words += ["--processes", str(array.processes)]
    return " ".join(words + ["--signal-grace", str(array.grace_s)])


HEAD = """\
#!/bin/bash
# ssa-kit: profile {name} {shape}
# (written by `./run_all.sh slurm`, kit/slurm.py).
# {what} into {outputs}, which all share (a lock per run).
# SIGUSR1 comes {grace} s (SLURM: up to {early} s more) before the time limit: the running point
# checkpoints and the job is requeued to resume it, at most {requeues} times (docs/cluster.md).
"""
ARRAY = """\
# this task by its array name: one task's own SLURM_JOB_ID is also the array's id, and
# `scontrol requeue` of that id would requeue every task
task="${{SLURM_ARRAY_JOB_ID}}_${{SLURM_ARRAY_TASK_ID}}"
echo "ssa-kit: task $task, shard $SLURM_ARRAY_TASK_ID/{tasks}," \\"""
NODES = """\
task="$SLURM_JOB_ID"
# torchrun's rendezvous: on the first node of the allocation, at a port of this job's own
head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)
port=$((20000 + SLURM_JOB_ID % 20000))
echo "ssa-kit: job $task, {nodes} nodes ($SLURM_JOB_NODELIST), rendezvous $head:$port," \\"""
BODY = """\
cd {project} || exit 1
{who}
  "start $((SLURM_RESTART_COUNT + 1)) on $(hostname) at $(date '+%F %T')"

# {what_runs} in the background: a shell acts on a trapped signal only once its
# foreground command ends, and an untrapped SIGUSR1 ends it (FAILED). The traps come first; a
# signal that comes before the batch has started is passed on once it has
batch="" warned="" early=""
trap 'warned=yes early=USR1; [ -n "$batch" ] && kill -USR1 $batch 2>/dev/null' USR1
# SIGINT too is passed on as SIGTERM (a background job ignores SIGINT; the batch treats it alike)
trap 'early=${{early:-TERM}}; [ -n "$batch" ] && kill -TERM $batch 2>/dev/null' TERM INT
{command} &
batch=$!
[ -n "$early" ] && kill -$early $batch 2>/dev/null
# a trapped signal ends `wait` early: wait again until the batch itself has exited
while kill -0 $batch 2>/dev/null; do wait $batch; done
wait $batch
status=$?

# {preempted}: the batch stopped on a signal, checkpointed, and got further than the last start
# (else it exits 3). After SIGUSR1 (the time limit's warning, or scancel --signal=USR1 --batch)
# the job requeues itself, up to {requeues} times. Not after SIGTERM alone: that is scancel (a
# requeue would undo it) or a preemption that SLURM requeues by itself.
if [ $status -eq {preempted} ] && [ -n "$warned" ]; then
  if [ "${{SLURM_RESTART_COUNT:-0}}" -ge {requeues} ]; then
    echo "ssa-kit: {unit} $task stopped on SIGUSR1 after {requeues} requeue(s) (--max-requeues):" \\
      "not requeued; sbatch {script} again to go on"
  else
    echo "ssa-kit: {unit} $task stopped on SIGUSR1 and checkpointed; requeueing it"
    # a requeue that takes ends the job at once, scontrol too (exit >= 128): no refusal then
    scontrol requeue "$task" || {{ [ $? -lt 128 ] && echo "ssa-kit: requeue refused; sbatch" \\
      "{script} again (finished points are skipped, the stopped one resumes)"; }}
  fi
fi
echo "ssa-kit: {unit} $task exits $status at $(date '+%F %T')"
exit $status
"""


def script(array: Array) -> str:
    nodes, n = array.nodes > 1, array.tasks
    shape, what, runs = (
        (f"as one job on {array.nodes} nodes", f"Every point of the grid frozen in {array.profile}"
         f" runs on all of them\n# ({array.processes} process(es) each),", "srun runs the batches")
        if nodes else (f"as a SLURM job array of {n} task(s)", f"Task i runs shard i/{n} of the "
                       f"grid frozen in {array.profile}\n# (chains of points i, i+{n} ...)",
                       "the batch runs"))
    head = HEAD.format(name=array.name, shape=shape, what=what, outputs=array.outputs,
                       grace=array.grace_s, early=EARLY_S, requeues=array.max_requeues)
    body = BODY.format(project=shlex.quote(str(array.project)), what_runs=runs,
                       who=(NODES if nodes else ARRAY).format(tasks=n, nodes=array.nodes),
                       command=batch_command(array), preempted=PREEMPTED_EXIT,
                       requeues=array.max_requeues, script=shlex.quote(str(array.script_path)),
                       unit="job" if nodes else "task")
    return head + "\n".join(directives(array)) + "\n\n" + body
