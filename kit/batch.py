"""Run a profile: a YAML grid of notebook parameters, one papermill-executed notebook per point.

    python -m kit.batch PROFILE [--shard i/n] [--outputs DIR] [--no-report | --report-only]

First a pre-flight, before any notebook kernel starts: the profile, every point's config and
every task's data files are checked, so a typo or a bad file stops the batch in seconds with
one line. Then the points run one after another in one warm kernel (kit.kernels: imports paid
once, namespace cleared between points, a fresh kernel after a failed point; --fresh-kernels
for one kernel per point); training progress is streamed to this terminal as plain lines.
Finished runs (metrics.json status ok) are skipped, so a rerun retries only failed and missing
ones; a failed run is recorded and the batch goes on; a lock per run keeps two batches on the
same profile from running one config twice. At the end kit.results.profile_outputs
writes outputs/tables/<profile>.{md,csv,tex}, prints the main table, draws the profile's
figures and prints a summary line; the exit status is 1 if any run failed. Last, in the same
kernel, the report (kit.results.page), whose path is the last line (--no-report or `report:
false`: none); --report-only rebuilds tables, figures and report from the runs present.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from kit import io as kio
from kit.train import progress as kprogress
from kit.config.run_config import ConfigError, RunConfig
from kit.models.backbones import ModelError
from kit.kernels import Kernels
from kit.results import profile_outputs
from kit.train.preemption import FORWARD, PREEMPTED_EXIT, forwarding_signals
from kit.train.preflight import missing_task_files, preflight  # noqa: F401 (re-exported)
from kit.train.provenance import environment
from kit.config.profiles import REPO, Profile, load_profile, profile_path, shard  # noqa: F401 (re-exported)
from kit.data.readers import DataError
from kit.runs import finished_metrics, make_run_dir, read_metrics, record_failed, run_dir_of

# ---------------------------------------------------------------- one point

def execute(profile: Profile, point: dict, processes: int = 1,
            kernels: Kernels | None = None, nodes: int = 1, rdzv: str = "") -> tuple[str, str]:
    """Run one grid point through papermill in `kernels` (None: a fresh kernel); returns
    (status, detail), status one of ok, skipped, failed. The executed notebook is written to a
    temp file and renamed into the run folder only by the batch that ran the point: a second
    batch never touches it. processes > 1: the point runs data-parallel under torchrun
    (`python -m kit.train.finetune`), with no notebook (a kernel is one process). Status
    `preempted`: a signal stopped the point (its checkpoint is written; rerunning resumes it).
    nodes > 1: this node's share of a run on several nodes, which meet at `rdzv` (HOST:PORT):
    every node's batch launches every point (no batch lock: the run's own lock, taken by the
    process of global rank 0, keeps two runs of one config apart)."""
    cfg = RunConfig.from_dict(point)
    if finished_metrics(cfg) is not None:
        return "skipped", "finished earlier"
    run_dir = make_run_dir(cfg)
    if nodes > 1:
        return _run_distributed(cfg, processes, nodes, rdzv)
    with kio.FileLock(run_dir / ".batch.lock") as got:
        if not got:
            return "skipped", "running in another batch"
        if finished_metrics(cfg) is not None:               # it may have finished while we looked
            return "skipped", "finished earlier"
        if processes > 1:
            return _run_distributed(cfg, processes)
        FORWARD.kernels = kernels = kernels or Kernels(fresh=True)
        try:
            with kio.atomic_path(run_dir / "notebook.ipynb") as tmp:
                status, detail = _run_notebook(kernels, profile, cfg, tmp)
                if status in ("skipped", "preempted"):   # not ours to write / not finished
                    raise _Discard
        except _Discard:
            pass
        finally:
            FORWARD.kernels = None
        return status, detail


class _Discard(Exception):
    """Leave the temp notebook unwritten (kio.atomic_path removes it)."""


def _run_notebook(kernels: Kernels, profile: Profile, cfg: RunConfig,
                  output: Path) -> tuple[str, str]:
    # the whole resolved config, not just the grid point: the notebook's own defaults (a smoke
    # configuration) must not leak into the run, or its run id would differ from ours
    parameters = {k: list(v) if isinstance(v, tuple) else v for k, v in cfg.to_dict().items()}
    try:
        kernels.execute(profile.notebook_for(cfg), output, parameters, stderr_file=sys.stderr)
    except Exception as err:   # the notebook failed or its kernel died
        detail = _failure_reason(err)
        if detail.startswith("RunLocked"):      # fit() refused: another process trains it
            return "skipped", "running in another process"
        if detail.startswith("RunPreempted") or FORWARD.received:
            return "preempted", detail.partition(": ")[2] or FORWARD.received
        return _failed(cfg, detail)
    return "ok", ""


def _failed(cfg: RunConfig, detail: str, processes: int = 1) -> tuple[str, str]:
    """The run's own failure record, or one for a process that died before writing it."""
    try:
        recorded = read_metrics(run_dir_of(cfg)) or {}
    except (OSError, ValueError):
        recorded = {}
    if recorded.get("status") != "failed":
        record_failed(cfg, detail, environment=environment(processes))
    return "failed", recorded.get("error") or detail


def _run_distributed(cfg: RunConfig, processes: int, nodes: int = 1,
                     rdzv: str = "") -> tuple[str, str]:
    """One point on `processes` data-parallel processes per node (gloo on CPU, NCCL on GPUs):
    torchrun, on this node alone or on `nodes` nodes meeting at `rdzv`. Their progress lines
    stream to this terminal; a crash is recorded as failed."""
    import subprocess
    import tempfile
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(cfg.to_dict(), f)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={processes}", "-m", "kit.train.finetune", f.name]
    if nodes > 1:     # c10d rendezvous: each point meets under its own id, ranks by arrival
        cmd[3:4] = [f"--nnodes={nodes}", "--rdzv-backend=c10d", f"--rdzv-endpoint={rdzv}",
                    f"--rdzv-id={cfg.run_id}"]
    # torchrun warns unless the threads per process are set: share the cores between them
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get(
        "OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // processes)))}
    errors, echo = [], True
    try:
        with subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True) as proc:
            FORWARD.child = proc
            for line in proc.stderr:         # the ranks' progress lines, as they come
                if line.startswith("error: "):       # kit.train.finetune's one-line failure
                    errors.append(line.strip().removeprefix("error: "))
                    continue
                echo = echo and "Traceback" not in line and "ChildFailedError" not in line
                if echo:
                    sys.stderr.write(line)
    finally:
        FORWARD.child = None
        os.unlink(f.name)
    if proc.returncode == 0:
        return "ok", ""
    detail = errors[0] if errors else f"torchrun exit {proc.returncode}"
    if detail.startswith("RunLocked"):
        return "skipped", "running in another process"
    if detail.startswith("RunPreempted") or FORWARD.received:
        return "preempted", detail.partition(": ")[2] or FORWARD.received
    return _failed(cfg, detail, processes * nodes)


def _failure_reason(err: Exception) -> str:
    ename, evalue = getattr(err, "ename", None), getattr(err, "evalue", None)
    text = f"{ename}: {evalue}" if ename else f"{type(err).__name__}: {err}"
    return text.strip().splitlines()[0] if text.strip() else type(err).__name__


# ---------------------------------------------------------------- the grid

def point_label(fields: Mapping) -> str:
    """`task=RTE method=ssa-h seed=0 model=minilm`: how a batch's lines name a point, from its
    config (RunConfig.to_dict(), or a run's config.json)."""
    return " ".join(f"{k}={fields[k]}" for k in ("task", "method", "seed", "model"))


def _eta(started: float, ran: int, left: int) -> str:
    if not ran or not left:
        return ""
    s = (time.perf_counter() - started) / ran * left
    return f", ETA {s // 60:.0f}m{s % 60:02.0f}s"


def prepare_kernels() -> None:
    """What every batch (and kit.run) sets before its first kernel, which inherits it."""
    import logging
    # papermill warns about parameters missing from the notebook's parameters cell; every
    # parameter was validated against RunConfig, so those warnings are noise here
    logging.getLogger("papermill").setLevel(logging.ERROR)
    os.environ[kprogress.ENV] = os.environ.get(kprogress.ENV) or "lines"   # progress as lines
    # OpenMP threads that wait sleep instead of spinning: spinning threads of one process steal
    # the cores of another on a shared machine (run_all.sh sets it too)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def run_profile(name: str, shard_spec: str | None = None, outputs_dir: str = "outputs",
                processes: int = 1, fresh_kernels: bool = False, report: bool = True,
                nodes: int = 1, rdzv: str = "") -> int:
    prepare_kernels()
    profile = load_profile(name, outputs_dir)
    points = resume_first(shard(profile.points, shard_spec))
    started = time.perf_counter()
    absent = preflight(profile, points)
    print(f"profile {profile.name}: {len(points)} runs, data checked in "
          f"{time.perf_counter() - started:.1f}s", flush=True)
    counts = {"ok": 0, "skipped": 0, "failed": 0, "absent": 0, "preempted": 0}
    started, ran = time.perf_counter(), 0
    with Kernels(fresh=fresh_kernels) as kernels, forwarding_signals() as signals:
        for i, point in enumerate(points, 1):
            if signals.received:              # a scheduler wants the node back: no new point
                return _stopped(profile, signals.received, points[i - 1:], counts)
            cfg = RunConfig.from_dict(point)
            head = f"[{i}/{len(points)}] {point_label(cfg.to_dict())}"
            t0 = time.perf_counter()
            if cfg.run_id in absent:
                status, detail = "absent", absent[cfg.run_id]
            else:
                if finished_metrics(cfg) is None:
                    print(f"{head}: started", flush=True)
                status, detail = execute(profile, point, processes, kernels, nodes, rdzv)
            counts[status] += 1
            ran += status in ("ok", "failed")
            note = f" ({detail})" if detail else ""
            print(f"{head}: {status}{note} {time.perf_counter() - t0:.0f}s"
                  f"{_eta(started, ran, len(points) - i)}", flush=True)
            if status == "preempted":
                return _stopped(profile, signals.received, points[i:], counts)
        # inside the block: the report's notebooks run in the points' warm kernel
        profile_outputs.write(profile, outputs_dir, show=True)
        print(f"profile {profile.name}: {counts['ok']} ok, {counts['skipped']} skipped, "
              f"{counts['failed']} failed, {counts['absent']} absent (task files missing) "
              f"in {time.perf_counter() - started:.0f}s", flush=True)
        if report and profile.report:
            print(build_report(profile, outputs_dir, kernels, counts), flush=True)
    return 1 if counts["failed"] else 0


def build_report(profile: Profile, outputs_dir: str, kernels: Kernels,
                 counts: dict[str, int] | None = None) -> str:
    """The report's line: `report: outputs/reports/<profile>/index.html` (kit.results.page, its
    notebooks in `kernels`), or `report: failed (why)`: the results and the exit status stay."""
    from kit.results import page
    try:
        execute = functools.partial(kernels.execute, stderr_file=None)
        return f"report: {page.build(profile, outputs_dir, execute, counts)}"
    except Exception as err:   # the runs and tables are written: the page only is missing
        return f"report: failed ({_failure_reason(err)})"


def report_only(name: str, outputs_dir: str = "outputs") -> int:
    """`./run_all.sh report PROFILE`: tables, figures and report of the runs present."""
    prepare_kernels()
    profile = load_profile(name, outputs_dir)
    profile_outputs.write(profile, outputs_dir)
    with Kernels() as kernels:
        print(line := build_report(profile, outputs_dir, kernels), flush=True)
    return 1 if line.startswith("report: failed") else 0


def resume_first(points: list[dict]) -> list[dict]:
    """The grid with its preempted points first (the order otherwise kept): a requeued job
    resumes the run it left before it starts anything else."""
    def preempted(point: dict) -> bool:
        try:
            return (read_metrics(run_dir_of(RunConfig.from_dict(point))) or {}).get(
                "status") == "preempted"
        except (OSError, ValueError):
            return False
    return sorted(points, key=lambda p: not preempted(p))


def _stopped(profile: Profile, received: str | None, left: list[dict], counts: dict) -> int:
    """One line on what a signal left undone; the exit status a job script requeues on."""
    unfinished = sum(finished_metrics(RunConfig.from_dict(p)) is None for p in left)
    print(f"profile {profile.name}: stopped by {received or 'a signal'}: {counts['preempted']} "
          f"run(s) preempted with a checkpoint, {unfinished} not started; {counts['ok']} ok, "
          f"{counts['failed']} failed. Rerun the same command to resume "
          f"(exit {PREEMPTED_EXIT})", flush=True)
    return PREEMPTED_EXIT


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kit.batch", description=__doc__.splitlines()[0])
    parser.add_argument("profile", help="a name in params/ (demo, smoke, glue-small ...) or a YAML path")
    parser.add_argument("--shard", help="i/n: run every n-th grid point starting at i")
    parser.add_argument("--outputs", default=os.environ.get("SSA_KIT_OUTPUTS", "outputs"))
    parser.add_argument("--processes", type=int, default=1,
                        help="N > 1: each run data-parallel on N processes (torchrun; one per "
                             "GPU, or CPU processes with gloo); the global batch stays batch_size")
    parser.add_argument("--nodes", type=int, default=1,
                        help="N > 1: each run on N nodes x --processes (torchrun, c10d "
                             "rendezvous at --rdzv); run the same command on every node")
    parser.add_argument("--rdzv", default="",
                        help="HOST:PORT where the nodes meet (with --nodes; e.g. the first "
                             "node of a SLURM allocation)")
    parser.add_argument("--fresh-kernels", action="store_true",
                        help="start a new notebook kernel for every point (default: one warm "
                             "kernel runs the points one after another)")
    parser.add_argument("--no-report", action="store_true",
                        help="no HTML report at the end (as a profile's `report: false`)")
    parser.add_argument("--report-only", action="store_true", help="no training: tables, "
                        "figures and outputs/reports/<profile>/index.html of the runs present")
    args = parser.parse_args(argv)
    if args.processes < 1:
        parser.error("--processes must be >= 1")
    if args.nodes < 1 or (args.nodes > 1) != bool(args.rdzv):
        parser.error("--nodes N > 1 needs --rdzv HOST:PORT (and --rdzv needs --nodes > 1)")
    try:
        if args.report_only:
            return report_only(args.profile, args.outputs)
        return run_profile(args.profile, args.shard, args.outputs, args.processes,
                           args.fresh_kernels, report=not args.no_report, nodes=args.nodes,
                           rdzv=args.rdzv)
    except (ConfigError, DataError, ModelError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
