"""How a run begins and ends in its folder: the lifecycle every run trains in (`run_recorded`: a
finished run reused, the lock, config.json, metrics.json ok / failed / preempted) and the one
rerun protocol, which every door follows (kit.train's fit, kit.batch, kit.run, torchrun).

The rerun protocol. A rerun (cfg.rerun) replaces a finished run only once the new one ends ok:
under the run's lock `begin` sets the finished run's files aside (.<run_id>.previous, which no
table reads); the new run ending ok drops them (`end_rerun`). Whenever it ends without
finishing, they come back or a line says where they wait:
- it fails (its own error, a kernel that died, torchrun): `record_failed` puts them back, and
  the failure's line ends with KEPT. Whether it was started as the rerun or resumes one
  (a batch, a plain run, fit() with rerun false) does not matter: what is aside comes back;
- a signal stops it (preempted, or stopped before it trained): they wait for the run that
  resumes it, and the point's line says where (`aside_line`).
"""
from __future__ import annotations

import shutil
import traceback
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from kit import io as kio
from kit.config.run_config import RESOLVED, RunConfig
from kit.runs.read import (config_path, finished_metrics, metrics_path, previous_dir, read_json,
                           run_dir_of)
from kit.runs.write import make_run_dir

KEPT = "the finished run is kept (its rerun did not finish)"


class RunLocked(RuntimeError):
    pass


class RunPreempted(Exception):
    """A run stopped on a signal after writing a checkpoint (kit.train.preemption); `where`: what
    metrics.json records of it (signal, epoch, step, checkpoint ...). Rerunning resumes it."""

    def __init__(self, where: dict):
        super().__init__(f"stopped by {where.get('signal')} at epoch {where.get('epoch')}, "
                         f"step {where.get('step')}; rerun to resume")
        self.where = where


def base_record(cfg: RunConfig) -> dict:
    return {"run_id": cfg.run_id, "task": cfg.task, "model": cfg.model, "method": cfg.method,
            "seed": cfg.seed, "profile": cfg.profile,
            **({"tasks": list(cfg.tasks)} if cfg.tasks else {})}


def run_recorded(cfg: RunConfig, body, state, environment: Callable[[int], dict],
                 reused: Callable[[dict], None] = lambda metrics: None) -> dict:
    """The lifecycle of every run: a finished config is reused (`reused(its metrics)`) unless
    cfg.rerun, whose run replaces it only by ending ok (the rerun protocol above); one process
    trains a run at a time (RunLocked otherwise); config.json first, then metrics.json ok, or
    failed and the error. `body(cfg, run_dir)` trains, returns the metrics; a killed run (a
    rerun too) resumes inside it. Data-parallel: the main process alone locks, checks and
    writes; the other ranks hear whether to train. `state`: kit.train.accel.process_state();
    `environment(n)`: the record's provenance (kit.train.provenance.environment)."""
    if not state.is_main_process:
        verdict, payload = _broadcast(state, None)
        if verdict == "done":
            return payload
        if verdict == "locked":
            raise RunLocked(payload)
        return {**base_record(cfg), "status": "ok", "error": None, **body(cfg, run_dir_of(cfg))}
    done = finished_metrics(cfg)
    if done is not None and not cfg.rerun:
        reused(done)
        return _broadcast(state, ("done", done))[1]
    run_dir = make_run_dir(cfg)
    with lock(cfg) as locked:
        if not locked:
            message = f"{run_dir} is being trained by another process"
            _broadcast(state, ("locked", message))
            raise RunLocked(message)
        done = begin(cfg)                  # it may have finished while we waited for the lock
        if done is not None:
            reused(done)
            return _broadcast(state, ("done", done))[1]
        _broadcast(state, ("go", None))
        kio.write_json(run_dir / "config.json", {**cfg.to_dict(), "rerun": False})  # what ran
        try:
            result = body(cfg, run_dir)
        except RunPreempted as stopped:    # not a failure: the next invocation resumes it
            kio.write_json(run_dir / "metrics.json", {
                **base_record(cfg), "status": "preempted", "error": None,
                "preempted": stopped.where, "environment": environment(state.num_processes)})
            raise
        except BaseException as err:   # KeyboardInterrupt too: a stopped run must say so
            _write_failed(cfg, f"{type(err).__name__}: {err}".splitlines()[0],
                          traceback.format_exc(), environment(state.num_processes))
            _put_back(cfg)             # a rerun, or the run resuming one, did not finish
            raise
        metrics = {**base_record(cfg), "status": "ok", "error": None, **result,
                   "finished_at": datetime.now().astimezone().isoformat(timespec="seconds"),
                   "environment": environment(state.num_processes)}
        kio.write_json(run_dir / "metrics.json", metrics)
        end_rerun(cfg, ok=True)
        return metrics


def record_resolved(run_dir: Path, resolved: dict) -> None:
    """config.json's `resolved` block: what the run's `auto` settings became on its machine
    (kit.models.regional_compile.resolve_graphs), known once its loop is set up; the main
    process writes it."""
    path = config_path(run_dir)
    kio.write_json(path, {**read_json(path), RESOLVED: resolved})


def lock(cfg: RunConfig) -> kio.FileLock:
    """The run's lock: one process trains a run, or moves its files, at a time."""
    return kio.FileLock(run_dir_of(cfg) / ".lock")


def record_failed(cfg: RunConfig, error: str, tb: str | None = None,
                  environment: dict | None = None) -> str:
    """metrics.json with status failed where the run could not write it (kit.batch: its kernel
    or torchrun died); `environment`: where it ran (kit.train.provenance). Under the run's lock
    a finished run that a rerun set aside comes back: returns KEPT, or `aside_line` when another
    process holds the lock, or "" when none was set aside."""
    _write_failed(cfg, error, tb, environment)
    with lock(cfg) as got:
        return _put_back(cfg) if got else aside_line(cfg)


def record_blocked(cfg: RunConfig, why: str, source: str) -> bool:
    """metrics.json of a point that reads another point's output (SSA labels, an adapted model)
    when that source (run id `source`) did not finish ok: status failed, error `blocked (why)`,
    `blocked_by` the source; it never trained, so every reader counts it failed and a rerun
    tries it again after its source. False (nothing written) when another process holds the
    run. A finished run (a `rerun` of it blocked) keeps its record: a block never replaces it."""
    make_run_dir(cfg)
    with lock(cfg) as got:
        if got and finished_metrics(cfg) is None:
            kio.write_json(metrics_path(run_dir_of(cfg)), {
                **base_record(cfg), "status": "failed", "error": f"blocked ({why})",
                "blocked_by": source})
    return bool(got)


def _write_failed(cfg: RunConfig, error: str, tb: str | None, environment: dict | None) -> None:
    kio.write_json(metrics_path(run_dir_of(cfg)), {
        **base_record(cfg), "status": "failed", "error": error,
        **({"traceback": tb[-4000:]} if tb else {}), "environment": environment})


def begin(cfg: RunConfig) -> dict | None:
    """Under the lock, once what a process killed while moving a rerun's files left is settled:
    the finished run's metrics to reuse, else None; cfg.rerun sets its files aside (hidden)."""
    kio.settle(run_dir_of(cfg), previous_dir(cfg))
    if (done := finished_metrics(cfg)) is not None:
        end_rerun(cfg, ok=True)            # a run set aside whose rerun had finished
        if cfg.rerun:
            kio.set_aside(run_dir_of(cfg), previous_dir(cfg))
    return None if cfg.rerun else done


def end_rerun(cfg: RunConfig, ok: bool) -> None:
    """Under the lock, as a rerun ends: ok drops the run set aside, failed puts it back."""
    if (previous := previous_dir(cfg)).exists():
        shutil.rmtree(previous) if ok else kio.put_back(run_dir_of(cfg), previous)


def _put_back(cfg: RunConfig) -> str:
    """Under the lock, as a run ends without finishing: KEPT when a finished run came back."""
    if not previous_dir(cfg).exists():
        return ""
    end_rerun(cfg, ok=False)
    return KEPT


def aside_line(cfg: RunConfig) -> str:
    """Where a finished run set aside by a rerun waits ("" when none is): said whenever its
    rerun stops without finishing, so it is never out of sight."""
    if not previous_dir(cfg).exists():
        return ""
    return (f"the finished run waits in {previous_dir(cfg)} until this rerun finishes (it comes "
            "back if the rerun fails)")


def _broadcast(state, verdict):
    """The main process's verdict, on every rank (a no-op in one process)."""
    if state.num_processes == 1:
        return verdict
    from accelerate.utils import broadcast_object_list
    return broadcast_object_list([verdict])[0]
