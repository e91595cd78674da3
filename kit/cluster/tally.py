"""A batch's grid as its run folders record it, and the lines a batch ends with: which points
have a record (`records`), the order a requeued job takes them in (`resume_first`), how many the
whole grid has left (`unfinished`: a shard builds the report only when none is), the summary
lines and their exit status, and what a signal left undone (`stopped`)."""
from __future__ import annotations

import time
from collections import Counter

from kit.cluster.point import NOTEBOOK_FAILED
from kit.config import grids
from kit.config.profiles import Profile
from kit.config.run_config import RunConfig
from kit.runs import finished_metrics, notebook_path, readable_metrics, run_dir_of
from kit.train.preemption import PREEMPTED_EXIT

STUCK_EXIT = 3          # stopped, and a rerun would get no further (kit.batch's docstring)
OUTCOMES = ("ok", "skipped", "failed", "blocked", "absent", "preempted", "stopped",
            NOTEBOOK_FAILED)
TRAINED = ("ok", "failed", NOTEBOOK_FAILED)     # a point that ran to an end: progress


def records(points: list[dict]) -> dict[str, dict]:
    """{run id: metrics.json} of the points that have a readable one."""
    found = {}
    for cfg in map(RunConfig.from_dict, points):
        if (record := readable_metrics(run_dir_of(cfg))) is not None:
            found[cfg.run_id] = record
    return found


def resume_first(points: list[dict]) -> list[dict]:
    """The grid with its preempted points first (the order otherwise kept): a requeued job
    resumes the run it left before it starts anything else."""
    status = {k: r.get("status") for k, r in records(points).items()}
    return sorted(points, key=lambda p: status.get(RunConfig.from_dict(p).run_id) != "preempted")


def unfinished(points: list[dict]) -> int:
    """How many points have no final record (ok or failed) and their task's files (an absent
    point gets none): of the whole grid, when a shard asks whether it is the last."""
    from kit.train.preflight import missing_task_files     # data readers: loaded only here
    left = 0
    for cfg in map(RunConfig.from_dict, points):
        final = (readable_metrics(run_dir_of(cfg)) or {}).get("status") in ("ok", "failed")
        try:
            left += not final and missing_task_files(cfg) is None
        except (OSError, ValueError):        # a glue_dir gone
            left += 1
    return left


def where_line(points: list[dict], per_device: int, processes: int = 1) -> str:
    """Where the batch trains, as its first line says it: the device this process's torch sees
    (a GPU by name: a wheel that cannot see the driver shows up as `cpu` here), the precision
    each requested mixed_precision resolves to, the processes a run takes, and K."""
    import torch                                        # a batch pays for it once, here
    from kit.config.rules import precision_name
    from kit.train.accel import machine_device, machine_precision
    device = machine_device()
    gpu = f" ({torch.cuda.get_device_name(0)})" if device == "cuda" else ""
    asked = sorted({RunConfig.from_dict(p).mixed_precision for p in points})
    precisions = ", ".join(precision_name(machine_precision(a)) + (f" ({a})" if a == "auto" else "")
                           for a in asked)
    spread = f", {processes} processes a run" if processes > 1 else ""
    k = f"{per_device} points at once" if per_device > 1 else "one point at a time"
    return f"on {device}{gpu}, {precisions}{spread}, {k}"


def graphs_line(points: list[dict], processes: int = 1) -> str:
    """Which points replay CUDA graphs and why, as the batch's first line ends: each point's
    settings through kit.models.regional_compile.decide_graphs on this machine's device (its
    planned steps are counted as it starts), the reasons grouped."""
    from kit.models.regional_compile import resolve_graphs
    from kit.train.accel import machine_device
    device = machine_device()
    decided = [resolve_graphs(RunConfig.from_dict(p), device, None, processes) for p in points]
    reasons = Counter(r.cuda_graphs_reason for r in decided)
    why = "; ".join(reason if len(reasons) == 1 else f"{n}: {reason}"
                    for reason, n in reasons.items())
    return f"CUDA graphs: {sum(r.graphs for r in decided)} of {len(points)} points ({why})"


def eta(started: float, ran: int, left: int) -> str:
    if not ran or not left:
        return ""
    s = (time.perf_counter() - started) / ran * left
    return f", ETA {s // 60:.0f}m{s % 60:02.0f}s"


def summary(profile: Profile, counts: dict[str, int], started: float) -> str:
    """`profile p: 4 ok, 0 skipped, 1 failed, 0 absent (task files missing) in 30s`, and the
    points whose notebook failed after their run finished when there are any."""
    failed_notebooks = (f", {counts[NOTEBOOK_FAILED]} notebook failed after its run finished"
                        if counts[NOTEBOOK_FAILED] else "")
    blocked = (f", {counts['blocked']} blocked (a source failed)" if counts["blocked"] else "")
    return (f"profile {profile.name}: {counts['ok']} ok, {counts['skipped']} skipped, "
            f"{counts['failed']} failed{blocked}, {counts['absent']} absent (task files missing)"
            f"{failed_notebooks} in {time.perf_counter() - started:.0f}s")


def notebooks_line(profile: Profile, failed: list[RunConfig]) -> str:
    """Where to read the errors of the notebooks that failed after their run finished."""
    paths = ", ".join(str(notebook_path(run_dir_of(cfg))) for cfg in failed)
    return (f"profile {profile.name}: {len(failed)} finished run(s) whose notebook failed after "
            f"training (the runs are kept; the error is in the notebook): {paths}")


def held_line(profile: Profile, held: list[dict], lock_wait_s: float) -> str:
    locks = ", ".join(str(run_dir_of(RunConfig.from_dict(p)) / ".batch.lock") for p in held)
    return (f"profile {profile.name}: {len(held)} point(s) held by another batch for "
            f"{lock_wait_s:.0f}s (--lock-wait), not run here; rerun once it has ended "
            f"(docs/cluster.md): {locks}")


def exit_status(counts: dict[str, int], held: list) -> int:
    """1 when a point failed or was blocked, a finished run's notebook failed or another batch
    holds a point."""
    return 1 if counts["failed"] or counts["blocked"] or counts[NOTEBOOK_FAILED] or held else 0


def stopped(profile: Profile, received: str | None, points: list[dict], counts: dict,
            steps: dict, stopped_cfgs: list[RunConfig] = ()) -> int:
    """One line on what a signal left undone, and the exit status: PREEMPTED_EXIT, on which a
    job script requeues, or STUCK_EXIT where a rerun would get no further (grids.stuck): a
    stopped run (of `stopped_cfgs`, the points the signal stopped: one, or K at once) that
    trained without a checkpoint, or no progress in any of them."""
    finished = sum(counts[s] for s in TRAINED)
    found = records([cfg.to_dict() for cfg in stopped_cfgs]) if counts["preempted"] else {}
    wheres = {cfg.run_id: found.get(cfg.run_id, {}).get("preempted") or {}
              for cfg in stopped_cfgs}
    reasons = ({run_id: grids.stuck(run_id, where, steps.get(run_id), finished)
                for run_id, where in wheres.items()}
               or {None: grids.stuck(None, {}, None, finished)})
    # a run that trained without a checkpoint starts over whatever the others did; otherwise
    # the batch is stuck only when none of its stopped runs got further
    lost = [reasons[k] for k, where in wheres.items()
            if where.get("step") and where.get("checkpoint") is None]
    why = lost[0] if lost else None if None in reasons.values() else next(iter(reasons.values()))
    head, done = (f"profile {profile.name}: stopped by {received or 'a signal'}: ",
                  f"{counts['ok']} ok, {counts['failed']} failed")
    unfinished_now = sum(finished_metrics(RunConfig.from_dict(p)) is None for p in points)
    print(f"{head}{why}; {done} (exit {STUCK_EXIT})" if why else
          f"{head}{counts['preempted']} run(s) preempted with a checkpoint, "
          f"{unfinished_now - counts['preempted']} not started; {done}. Rerun the same command "
          f"to resume (exit {PREEMPTED_EXIT})", flush=True)
    return STUCK_EXIT if why else PREEMPTED_EXIT
