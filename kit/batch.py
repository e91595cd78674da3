"""Run a profile: a YAML grid of notebook parameters, one papermill-executed notebook per point.

    python -m kit.batch PROFILE [--shard i/n] [--outputs DIR] [--no-report | --report-only]
        [--processes N] [--signal-grace S] [--lock-wait S]

First a pre-flight, before any notebook kernel starts: the profile, every point's config and
every task's data files are checked, so a typo or a bad file stops the batch in seconds with
one line. Then the points run one after another in one warm kernel (kit.kernels: imports paid
once, namespace cleared between points; --fresh-kernels: one kernel per point); training
progress is streamed to this terminal as plain lines. Finished runs (metrics.json status ok)
are skipped, so a rerun retries only failed and missing ones; a failed run is recorded and the
batch goes on; a lock per run keeps two batches from running one config twice (a point another
batch holds is waited for at the end, up to --lock-wait). At the end kit.results.profile_outputs
writes the tables and figures, then a summary line and, in the same kernel, the report
(kit.results.page; --no-report or `report: false`: none; a shard builds it only when the whole
grid has finished); --report-only rebuilds tables, figures and report from the runs present.
Exit status: 0 all ok, 1 a run failed (or another batch still holds a point), 2 bad input, 75
stopped by a signal (rerun to resume), 3 stopped where a rerun would get no further.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import sys
import time
from pathlib import Path

from kit import io as kio, slurm
from kit.config import grids
from kit.config.grids import point_label  # noqa: F401 (bench/profile_wall.py reads it here)
from kit.config.paths import outputs_root
from kit.config.run_config import ConfigError, RunConfig
from kit.models.backbones import ModelError
from kit.kernels import (FORWARD, Kernels, forwarding_signals, prepare_kernels,  # noqa: F401
                         run_torchrun, torchrun_command)       # (kit.run uses these two)
from kit.results import profile_outputs
from kit.train.preemption import PREEMPTED_EXIT
from kit.train.preflight import missing_task_files, preflight  # noqa: F401 (re-exported)
from kit.config.profiles import REPO, Profile, load_profile, profile_path, shard  # noqa: F401 (re-exported)
from kit.data.readers import DataError
from kit.runs import (finished_metrics, make_run_dir, metrics_path, read_metrics, record_failed,
                      run_dir_of)

STUCK_EXIT = 3          # stopped, and a rerun would get no further (see the docstring)
LOCK_WAIT_S, LOCK_POLL_S = 600, 2.0     # a batch waits at its end for points another holds

# ---------------------------------------------------------------- one point

def execute(profile: Profile, point: dict, processes: int = 1, kernels: Kernels | None = None,
            nodes: int = 1, rdzv: str = "", grace_s: int = slurm.DEFAULT_GRACE_S
            ) -> tuple[str, str]:
    """Run one grid point through papermill in `kernels` (None: a fresh kernel); returns
    (status, detail): ok, skipped, failed, held (another batch or process runs it), preempted
    (a signal stopped its run, which recorded where) or stopped (a signal came before it
    trained). Only the batch that ran the point writes its executed notebook. processes > 1:
    torchrun (kit.train.finetune), no notebook; its workers get `grace_s` after a signal.
    nodes > 1: this node's share of a run on nodes meeting at `rdzv` (HOST:PORT); every node
    launches every point (no batch lock: the run's lock, taken by global rank 0, suffices)."""
    cfg = RunConfig.from_dict(point)
    if finished_metrics(cfg) is not None:
        return "skipped", "finished earlier"
    run_dir = make_run_dir(cfg)
    if nodes > 1:
        return _run_distributed(cfg, processes, grace_s, nodes, rdzv)
    with kio.FileLock(run_dir / ".batch.lock") as got:
        if not got:
            return "held", "running in another batch"
        if finished_metrics(cfg) is not None:               # it may have finished while we looked
            return "skipped", "finished earlier"
        if processes > 1:
            return _run_distributed(cfg, processes, grace_s)
        own = contextlib.nullcontext(kernels) if kernels else Kernels(fresh=True)
        try:
            with own as kernels, kio.atomic_path(run_dir / "notebook.ipynb") as tmp:
                status, detail = _run_notebook(kernels, profile, cfg, tmp)
                if status not in ("ok", "failed"):       # not ours to write / not finished
                    raise _Discard
        except _Discard:
            pass
        return status, detail


class _Discard(Exception):
    """Leave the temp notebook unwritten (kio.atomic_path removes it)."""


def _run_notebook(kernels: Kernels, profile: Profile, cfg: RunConfig,
                  output: Path) -> tuple[str, str]:
    # the whole resolved config, not just the grid point: the notebook's own defaults (a smoke
    # configuration) must not leak into the run, or its run id would differ from ours
    parameters = {k: list(v) if isinstance(v, tuple) else v for k, v in cfg.to_dict().items()}
    kernels.start()
    if FORWARD.received:            # while the kernel started: the point does not
        return "stopped", "not started"
    before = _record_stamp(cfg)
    # a signal goes on to the kernel until the run records its end (see kit.kernels.Forwarder)
    settled = lambda: _record_stamp(cfg) != before      # noqa: E731
    try:
        with FORWARD.point(kernels.signal, settled):
            kernels.execute(profile.notebook_for(cfg), output, parameters, stderr_file=sys.stderr)
    except Exception as err:   # the notebook failed, its kernel died, or a signal stopped it
        return _outcome(cfg, _failure_reason(err), settled())
    return "ok", ""


def _record_stamp(cfg: RunConfig) -> tuple | None:
    """Which metrics.json the run has (each write is a new file: kit.io), None if none."""
    try:
        stat = metrics_path(run_dir_of(cfg)).stat()
    except OSError:
        return None
    return stat.st_ino, stat.st_mtime_ns


def _outcome(cfg: RunConfig, detail: str, recorded: bool, processes: int = 1) -> tuple[str, str]:
    """What a point that ended in an error comes to, by its run's record (`recorded`: written
    while the point ran). A finished run stays finished (a signal after fit() cuts only cells)."""
    record = _records([cfg.to_dict()]).get(cfg.run_id, {})
    status = record.get("status")
    if status == "ok":
        return "ok", ""
    if detail.startswith("RunLocked"):      # fit() refused: another process trains it
        return "held", "running in another process"
    if recorded and status == "preempted":
        return "preempted", detail.partition(": ")[2] if detail.startswith(
            "RunPreempted") else FORWARD.received
    if FORWARD.received:
        return "stopped", "before it trained"
    if status != "failed":                  # a process that died before writing its record
        from kit.train.provenance import environment    # torch: a batch loads it only here
        record_failed(cfg, detail, environment=environment(processes))
    return "failed", record.get("error") or detail


def _run_distributed(cfg: RunConfig, processes: int, grace_s: int, nodes: int = 1,
                     rdzv: str = "") -> tuple[str, str]:
    """One point on `processes` data-parallel processes per node (gloo on CPU, NCCL on GPUs):
    torchrun, on this node alone or on `nodes` nodes meeting at `rdzv` (kit.kernels)."""
    import tempfile

    from kit.train.accel import cpu_threads     # torch: a batch of one process never loads it
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(cfg.to_dict(), f)
    cmd = torchrun_command(["-m", "kit.train.finetune", f.name], processes, grace_s, nodes,
                           rdzv, cfg.run_id)
    # torchrun warns unless the threads per process are set: share the cores between them
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get(
        "OMP_NUM_THREADS", str(cpu_threads(processes)))}
    before = _record_stamp(cfg)
    try:
        code, errors = run_torchrun(cmd, env)
    finally:
        os.unlink(f.name)
    if code == 0:
        return "ok", ""
    return _outcome(cfg, errors[0] if errors else f"torchrun exit {code}",
                    _record_stamp(cfg) != before, processes * nodes)


def _failure_reason(err: Exception) -> str:
    ename, evalue = getattr(err, "ename", None), getattr(err, "evalue", None)
    text = f"{ename}: {evalue}" if ename else f"{type(err).__name__}: {err}"
    return text.strip().splitlines()[0] if text.strip() else type(err).__name__


# ---------------------------------------------------------------- the grid

def _eta(started: float, ran: int, left: int) -> str:
    if not ran or not left:
        return ""
    s = (time.perf_counter() - started) / ran * left
    return f", ETA {s // 60:.0f}m{s % 60:02.0f}s"


def run_profile(name: str, shard_spec: str | None = None, outputs_dir: str = "outputs",
                processes: int = 1, fresh_kernels: bool = False, report: bool = True,
                nodes: int = 1, rdzv: str = "", grace_s: int = slurm.DEFAULT_GRACE_S,
                lock_wait_s: float = LOCK_WAIT_S) -> int:
    prepare_kernels()
    profile = load_profile(name, outputs_dir)
    # a shard takes whole chains: a point that reads another's output runs after it, here
    points = resume_first(grids.shard_points(profile.points, shard_spec))
    steps = {p: (r.get("preempted") or {}).get("step") for p, r in _records(points).items()}
    started = time.perf_counter()
    absent = preflight(profile, points)
    print(f"profile {profile.name}: {len(points)} runs, data checked in "
          f"{time.perf_counter() - started:.1f}s", flush=True)
    counts = dict.fromkeys(("ok", "skipped", "failed", "absent", "preempted", "stopped"), 0)
    started, ran, deadline, held = time.perf_counter(), 0, None, []
    pending = list(enumerate(points, 1))
    with Kernels(fresh=fresh_kernels) as kernels, forwarding_signals() as signals:
        while pending:                 # a second round and on: the points another batch held
            held = []
            for i, point in pending:
                if signals.received:          # a scheduler wants the node back: no new point
                    return _stopped(profile, signals.received, points, counts, steps)
                cfg = RunConfig.from_dict(point)
                head = f"[{i}/{len(points)}] {point_label(cfg.to_dict())}"
                t0 = time.perf_counter()
                if cfg.run_id in absent:
                    status, detail = "absent", absent[cfg.run_id]
                else:
                    if finished_metrics(cfg) is None and deadline is None:
                        print(f"{head}: started", flush=True)
                    status, detail = execute(profile, point, processes, kernels, nodes, rdzv,
                                             grace_s)
                if status == "held":
                    held.append((i, point))
                    if deadline is None:
                        print(f"{head}: held ({detail}): waited for at the end", flush=True)
                    continue
                counts[status] += 1
                ran += status in ("ok", "failed")
                print(f"{head}: {status}{f' ({detail})' if detail else ''} "
                      f"{time.perf_counter() - t0:.0f}s{_eta(started, ran, len(points) - i)}",
                      flush=True)
                if status in ("preempted", "stopped"):
                    return _stopped(profile, signals.received, points, counts, steps, cfg)
            deadline = deadline or time.monotonic() + lock_wait_s
            pending = held if held and time.monotonic() < deadline else []
            time.sleep(max(0.0, min(LOCK_POLL_S, deadline - time.monotonic())) if pending else 0)
        # inside the block: the report's notebooks run in the points' warm kernel
        profile_outputs.write(profile, outputs_dir, show=True)
        print(f"profile {profile.name}: {counts['ok']} ok, {counts['skipped']} skipped, "
              f"{counts['failed']} failed, {counts['absent']} absent (task files missing) "
              f"in {time.perf_counter() - started:.0f}s", flush=True)
        if held:
            locks = ", ".join(str(run_dir_of(RunConfig.from_dict(p)) / ".batch.lock")
                              for _, p in held)
            print(f"profile {profile.name}: {len(held)} point(s) held by another batch for "
                  f"{lock_wait_s:.0f}s (--lock-wait), not run here; rerun once it has ended "
                  f"(docs/cluster.md): {locks}", flush=True)
        if report and profile.report:
            print(_report(profile, outputs_dir, kernels, counts, shard_spec, signals.received),
                  flush=True)
    return 1 if counts["failed"] or held else 0


def _report(profile: Profile, outputs_dir: str, kernels: Kernels, counts: dict,
            shard_spec: str | None, received: str | None) -> str:
    """The report's line: a shard builds it only if it finds the whole grid finished."""
    if received:
        return f"report: not built (stopped by {received}; ./run_all.sh report builds it)"
    left = slurm.unfinished(profile.points) if shard_spec else 0
    if left:
        return (f"report: left to the shard that finishes the grid ({left} of "
                f"{len(profile.points)} point(s) not finished)")
    return build_report(profile, outputs_dir, kernels, counts)


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


def _records(points: list[dict]) -> dict[str, dict]:
    """{run id: metrics.json} of the points that have a readable one."""
    found = {}
    for cfg in map(RunConfig.from_dict, points):
        with contextlib.suppress(OSError, ValueError):
            found[cfg.run_id] = read_metrics(run_dir_of(cfg)) or {}
    return found


def resume_first(points: list[dict]) -> list[dict]:
    """The grid with its preempted points first (the order otherwise kept): a requeued job
    resumes the run it left before it starts anything else."""
    status = {k: r.get("status") for k, r in _records(points).items()}
    return sorted(points, key=lambda p: status.get(RunConfig.from_dict(p).run_id) != "preempted")


def _stopped(profile: Profile, received: str | None, points: list[dict], counts: dict,
             steps: dict, stopped: RunConfig | None = None) -> int:
    """One line on what a signal left undone, and the exit status: 75, on which a job script
    requeues, or STUCK_EXIT where a rerun would get no further (kit.config.grids.stuck)."""
    run_id = stopped and stopped.run_id
    record = _records([stopped.to_dict()]).get(run_id, {}) if counts["preempted"] else {}
    why = grids.stuck(run_id, record.get("preempted") or {}, steps.get(run_id),
                      counts["ok"] + counts["failed"])
    head, done = (f"profile {profile.name}: stopped by {received or 'a signal'}: ",
                  f"{counts['ok']} ok, {counts['failed']} failed")
    unfinished = sum(finished_metrics(RunConfig.from_dict(p)) is None for p in points)
    print(f"{head}{why}; {done} (exit {STUCK_EXIT})" if why else
          f"{head}{counts['preempted']} run(s) preempted with a checkpoint, "
          f"{unfinished - counts['preempted']} not started; {done}. Rerun the same command to "
          f"resume (exit {PREEMPTED_EXIT})", flush=True)
    return STUCK_EXIT if why else PREEMPTED_EXIT


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kit.batch", description=__doc__.splitlines()[0])
    parser.add_argument("profile", help="a name in params/ (demo, smoke, glue-small ...) or a YAML path")
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
    parser.add_argument("--signal-grace", type=int, default=slurm.DEFAULT_GRACE_S, metavar="S",
                        help="with --processes: torchrun's workers get S s to checkpoint after "
                             f"a signal (default {slurm.DEFAULT_GRACE_S})")
    parser.add_argument("--lock-wait", type=float, default=LOCK_WAIT_S, metavar="S", help="wait "
                        f"up to S s for points another batch holds (default {LOCK_WAIT_S})")
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
                           rdzv=args.rdzv, grace_s=args.signal_grace, lock_wait_s=args.lock_wait)
    except (ConfigError, DataError, ModelError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
