"""Run a profile: a YAML grid of notebook parameters, one papermill-executed notebook per point.

    python -m kit.batch PROFILE [--only KEY=V1,V2 ...] [--shard i/n] [--outputs DIR]
        [--no-report | --report-only] [--processes N | --per-device K] [--signal-grace S]
        [--lock-wait S] [--ignore-disk]

First a pre-flight, before any notebook kernel starts: the profile, every point's config and
every task's data files are checked, so a typo or a bad file stops the batch in seconds with
one line. Then the points run one after another in one warm kernel (kit.cluster.kernels: imports paid
once, namespace cleared between points; --fresh-kernels: one kernel per point; --per-device K:
K points at once, each in a kernel of its own, a chain's points one after another:
kit.cluster.pool); training progress is streamed to this terminal as plain lines. Finished
runs (metrics.json status ok) are skipped, so a rerun retries only failed and missing ones; a
failed run is recorded and the batch goes on; a lock per run keeps two batches from running one
config twice (a point another batch holds is waited for at the end, up to --lock-wait). At the
end kit.results.report.profile_outputs writes the tables and figures, then a summary line and, in
the same kernel, the report (kit.results.report.page; --no-report or `report: false`: none; a shard
builds it only when the whole grid has finished); --report-only rebuilds tables, figures and report
from the runs present.
A point's failure is its own: a kernel that cannot start fails that point, and a cell that
raises after fit() has finished its run makes the point `notebook failed` (the run is kept,
never rerun; only a signal's cut of those cells stays silent). kit.cluster holds the parts:
one point (point), its kernel (kernels), the signals (signals), the points one or K at once
(pool), the grid's records and lines (tally). The first line says where the batch trains (the
device, a GPU by name, the precision `auto` chose, K) and which points replay CUDA graphs, and
why. Exit status: 0 all ok, 1 a run failed (or was blocked: a source it reads failed; or a
finished run's notebook failed, or another batch still holds a point), 2 bad input, 75 stopped
by a signal (rerun to resume), 3 stopped where a rerun would get no further.
"""
from __future__ import annotations

import argparse
import functools
import sys
import time

from kit.cluster import costs, pool, tally
from kit.cluster.tally import resume_first
from kit.cluster.kernels import Kernels, prepare_kernels
from kit.cluster.point import execute, failure_reason
from kit.cluster.signals import DEFAULT_GRACE_S, forwarding_signals
from kit.config.grids import shard_points
from kit.config.paths import outputs_root
from kit.config.run_config import ConfigError, RunConfig
from kit.data.pipeline import sources_line
from kit.models.backbones import ModelError
from kit.results.report import profile_outputs
from kit.train.preflight import preflight
from kit.config.profiles import Profile, load_profile
from kit.data.readers import DataError

LOCK_WAIT_S = 600       # a batch waits at its end for points another holds


def run_profile(name: str, shard_spec: str | None = None, outputs_dir: str = "outputs",
                processes: int = 1, fresh_kernels: bool = False, report: bool = True,
                nodes: int = 1, rdzv: str = "", grace_s: int = DEFAULT_GRACE_S,
                lock_wait_s: float = LOCK_WAIT_S, per_device: int | None = None,
                only: list[str] | None = None, ignore_disk: bool = False) -> int:
    prepare_kernels()
    profile = load_profile(name, outputs_dir, only)
    pool.refuse_mixed(per_device or profile.per_device, processes, nodes,
                      "--per-device" if per_device else f"per_device in {profile.path}")
    per_device = per_device or profile.per_device
    # a shard takes whole chains: a point that reads another point's output runs after it, here
    points = resume_first(shard_points(profile.points, shard_spec))
    records = tally.records(points)         # every point's metrics.json, read once
    steps = {p: (r.get("preempted") or {}).get("step") for p, r in records.items()}
    started = time.perf_counter()
    absent = preflight(profile, points)
    if not ignore_disk:
        costs.check_disk(points, {k for k, r in records.items() if r.get("status") == "ok"},
                         outputs_root(outputs_dir))
    print(f"profile {profile.name}: {len(points)} runs, data checked in "
          f"{time.perf_counter() - started:.1f}s; "
          f"{tally.where_line(points, per_device, processes * nodes)}; "
          f"{tally.graphs_line(points, processes * nodes)}", flush=True)
    if line := sources_line([RunConfig.from_dict(p) for p in points if p and p.get("task")]):
        print(line, flush=True)
    run = lambda point, kernels: execute(profile, point, processes, kernels, nodes,  # noqa: E731
                                         rdzv, grace_s)
    points_run = pool.Batch(profile, points, absent, run)
    with Kernels(fresh=fresh_kernels) as kernels, forwarding_signals() as signals:
        if not pool.run_all(points_run, kernels, per_device, fresh_kernels, lock_wait_s):
            return tally.stopped(profile, signals.received, points, points_run.counts, steps,
                                points_run.stopped)
        counts, held = points_run.counts, points_run.held
        # inside the block: the report's notebooks run in the points' warm kernel
        profile_outputs.write(profile, outputs_dir, show=True)
        print(tally.summary(profile, counts, points_run.started), flush=True)
        for error in points_run.errors:      # a slot's own error: the others took its points
            print(f"profile {profile.name}: {error} (a bug of the batch, not of a point; its "
                  "traceback is above)", flush=True)
        if held:
            print(tally.held_line(profile, [p for _, p in held], lock_wait_s), flush=True)
        if points_run.notebooks:
            print(tally.notebooks_line(profile, points_run.notebooks), flush=True)
        if report and profile.report:
            print(_report(profile, outputs_dir, kernels, counts, shard_spec, signals.received),
                  flush=True)
    return max(tally.exit_status(counts, held), int(bool(points_run.errors)))


def _report(profile: Profile, outputs_dir: str, kernels: Kernels, counts: dict,
            shard_spec: str | None, received: str | None) -> str:
    """The report's line: a shard builds it only if it finds the whole grid finished."""
    if received:
        return f"report: not built (stopped by {received}; ./run_all.sh report builds it)"
    left = tally.unfinished(profile.points) if shard_spec else 0
    if left:
        return (f"report: left to the shard that finishes the grid ({left} of "
                f"{len(profile.points)} point(s) not finished)")
    return build_report(profile, outputs_dir, kernels, counts)


def build_report(profile: Profile, outputs_dir: str, kernels: Kernels,
                 counts: dict[str, int] | None = None) -> str:
    """The report's line: `report: outputs/reports/<profile>/index.html` (kit.results.report.page,
    its notebooks in `kernels`), or `report: failed (why)`: the results and the exit status stay."""
    from kit.results.report import page
    try:
        execute = functools.partial(kernels.execute, stderr_file=None)
        return f"report: {page.build(profile, outputs_dir, execute, counts)}"
    except Exception as err:   # the runs and tables are written: the page only is missing
        return f"report: failed ({failure_reason(err)})"


def report_only(name: str, outputs_dir: str = "outputs", only: list[str] | None = None) -> int:
    """`./run_all.sh report PROFILE`: tables, figures and report of the runs present."""
    prepare_kernels()
    profile = load_profile(name, outputs_dir, only)
    profile_outputs.write(profile, outputs_dir)
    with Kernels() as kernels:
        print(line := build_report(profile, outputs_dir, kernels), flush=True)
    return 1 if line.startswith("report: failed") else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kit.batch", description=__doc__.splitlines()[0])
    parser.add_argument("profile", help="a name in params/ (demo, smoke, glue-small ...) or a YAML path")
    parser.add_argument("--only", action="append", default=[], metavar="KEY=V1,V2",
                        help="only the grid's points whose KEY is one of the values, e.g. "
                             "task=RTE,MRPC (repeatable; the whole profile's run ids)")
    parser.add_argument("--shard", help="i/n: run every n-th grid point starting at i")
    parser.add_argument("--outputs", default=str(outputs_root()))
    parser.add_argument("--processes", type=int, default=1, help="N > 1: each run data-parallel "
                        "on N processes (torchrun; GPUs, or CPU processes with gloo)")
    parser.add_argument("--nodes", type=int, default=1, help="N > 1: each run on N nodes x "
                        "--processes (torchrun's c10d rendezvous at --rdzv); the same command "
                        "on every node")
    parser.add_argument("--rdzv", default="", help="HOST:PORT where the nodes meet (with "
                        "--nodes; e.g. the first node of a SLURM allocation)")
    parser.add_argument("--fresh-kernels", action="store_true", help="a new notebook kernel for "
                        "every point (default: one warm kernel runs them one after another)")
    parser.add_argument("--no-report", action="store_true",
                        help="no HTML report at the end (as a profile's `report: false`)")
    parser.add_argument("--report-only", action="store_true", help="no training: tables, "
                        "figures and outputs/reports/<profile>/index.html of the runs present")
    parser.add_argument("--signal-grace", type=int, default=DEFAULT_GRACE_S, metavar="S",
                        help="with --processes: torchrun's workers get S s to checkpoint after "
                             f"a signal (default {DEFAULT_GRACE_S})")
    parser.add_argument("--lock-wait", type=float, default=LOCK_WAIT_S, metavar="S", help="wait "
                        f"up to S s for points another batch holds (default {LOCK_WAIT_S})")
    parser.add_argument("--per-device", type=int, metavar="K", help="run K points at once, "
                        "each in a kernel of its own with cores / K torch threads, sharing the "
                        "device (a GPU, or the CPU); a chain's points still one after another "
                        "(default: the profile's per_device, else 1)")
    parser.add_argument("--ignore-disk", action="store_true", help="run even when the plan's "
                        "disk (kit.plan) exceeds the outputs folder's free space")
    args = parser.parse_args(argv)
    if args.processes < 1:
        parser.error("--processes must be >= 1")
    if args.signal_grace < 1:
        parser.error(f"--signal-grace must be >= 1 (seconds), got {args.signal_grace}")
    if args.lock_wait < 0:
        parser.error(f"--lock-wait must be >= 0 (seconds), got {args.lock_wait:g}")
    if args.per_device is not None and args.per_device < 1:
        parser.error("--per-device must be >= 1")
    if args.nodes < 1 or (args.nodes > 1) != bool(args.rdzv):
        parser.error("--nodes N > 1 needs --rdzv HOST:PORT (and --rdzv needs --nodes > 1)")
    try:
        if args.report_only:
            return report_only(args.profile, args.outputs, args.only)
        return run_profile(args.profile, args.shard, args.outputs, args.processes,
                           args.fresh_kernels, report=not args.no_report, nodes=args.nodes,
                           rdzv=args.rdzv, grace_s=args.signal_grace, lock_wait_s=args.lock_wait,
                           per_device=args.per_device, only=args.only,
                           ignore_disk=args.ignore_disk)
    except (ConfigError, DataError, ModelError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
