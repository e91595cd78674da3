"""One grid point: its notebook through papermill in the batch's kernel, or torchrun for a
data-parallel point, and what it comes to (ok, skipped, failed, held, preempted, stopped, or
`notebook failed`: its run finished ok and a cell after fit() raised), by its run's record.
A point's failure is the point's alone: a kernel that cannot start included, the batch goes on.
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path

from kit import io as kio
from kit.cluster.kernels import Kernels
from kit.cluster.signals import DEFAULT_GRACE_S, FORWARD
from kit.cluster.torchrun import run_torchrun, torchrun_command
from kit.config.profiles import Profile
from kit.config.run_config import RunConfig
from kit.runs import (KEPT, aside_line, finished_metrics, make_run_dir, metrics_stamp,
                      previous_dir, readable_metrics, record_failed, run_dir_of)

NOTEBOOK_FAILED = "notebook failed"     # the run finished ok, a cell after fit() raised
WRITES_NOTEBOOK = ("ok", "failed", NOTEBOOK_FAILED)     # the outcomes whose notebook is kept


def execute(profile: Profile, point: dict, processes: int = 1, kernels: Kernels | None = None,
            nodes: int = 1, rdzv: str = "", grace_s: int = DEFAULT_GRACE_S) -> tuple[str, str]:
    """Run one grid point through papermill in `kernels` (None: a fresh kernel); returns
    (status, detail): ok, skipped, failed, held (another batch or process runs it), preempted
    (a signal stopped its run, which recorded where), stopped (a signal came before it
    trained) or NOTEBOOK_FAILED. A finished point is skipped unless it is a rerun (kit.run
    rerun=true: its run replaces the finished one only by ending ok, kit.runs.lifecycle). Only the
    batch that ran the point writes its executed notebook. processes > 1: torchrun
    (kit.train.finetune), no notebook; its workers get `grace_s` after a signal. nodes > 1:
    this node's share of a run on nodes meeting at `rdzv` (HOST:PORT); every node launches
    every point (no batch lock: the run's lock, taken by global rank 0, suffices)."""
    cfg = RunConfig.from_dict(point)
    if _finished(cfg):
        return "skipped", "finished earlier"
    run_dir = make_run_dir(cfg)
    if nodes > 1:
        return _run_distributed(cfg, processes, grace_s, nodes, rdzv)
    with kio.FileLock(run_dir / ".batch.lock") as got:
        if not got:
            return "held", "running in another batch"
        if _finished(cfg):                  # it may have finished while we looked
            return "skipped", "finished earlier"
        if processes > 1:
            return _run_distributed(cfg, processes, grace_s)
        own = contextlib.nullcontext(kernels) if kernels else Kernels(fresh=True)
        try:
            with own as kernels, kio.atomic_path(run_dir / "notebook.ipynb") as tmp:
                status, detail = _run_notebook(kernels, profile, cfg, tmp)
                if status not in WRITES_NOTEBOOK:       # not ours to write / not finished
                    raise _Discard
        except _Discard:
            pass
        return status, detail


def _finished(cfg: RunConfig) -> bool:
    return not cfg.rerun and finished_metrics(cfg) is not None


class _Discard(Exception):
    """Leave the temp notebook unwritten (kio.atomic_path removes it)."""


def _run_notebook(kernels: Kernels, profile: Profile, cfg: RunConfig,
                  output: Path) -> tuple[str, str]:
    # the whole resolved config, not just the grid point: the notebook's own defaults (a smoke
    # configuration) must not leak into the run, or its run id would differ from ours
    parameters = {k: list(v) if isinstance(v, tuple) else v for k, v in cfg.to_dict().items()}
    try:
        kernels.start()
    except Exception as err:    # it never ran: no record, and the next point gets a new kernel
        return "failed", f"the kernel did not start: {failure_reason(err)}"
    if FORWARD.received:            # while the kernel started: the point does not
        return "stopped", "not started"
    before = _stamps(cfg)
    # a signal goes on to the kernel until the run records its end (kit.cluster.signals)
    settled = lambda: metrics_stamp(run_dir_of(cfg)) not in before      # noqa: E731
    try:
        with FORWARD.point(kernels.signal, settled):
            kernels.execute(profile.notebook_for(cfg), output, parameters, stderr_file=sys.stderr)
    except Exception as err:   # the notebook failed, its kernel died, or a signal stopped it
        return outcome(cfg, failure_reason(err), before, notebook=True)
    return "ok", ""


def _stamps(cfg: RunConfig) -> set:
    """The records a point finds (its run's, and a finished run's a rerun set aside; None: no
    record): the run's record is still one of them until the point's run records its end, and
    an ok one among them after the point is none of its doing."""
    return {metrics_stamp(run_dir_of(cfg)), metrics_stamp(previous_dir(cfg))}


def outcome(cfg: RunConfig, detail: str, before: set, notebook: bool = False,
            processes: int = 1) -> tuple[str, str]:
    """What a point that ended in an error comes to, by its run's record (`before`: _stamps as
    the point began). A finished run stays finished: after a signal that cut the cells after
    fit() (or torchrun's exit after the record), ok; after a cell's own error, NOTEBOOK_FAILED.
    A finished run this point did not write is the one its failed rerun put back."""
    record = readable_metrics(run_dir_of(cfg)) or {}
    status, recorded = record.get("status"), metrics_stamp(run_dir_of(cfg)) not in before
    if detail.startswith("RunLocked"):      # fit() refused: another process trains it
        return "held", "running in another process"
    if status == "ok" and not recorded:
        return "failed", f"{detail}; {KEPT}"
    if status == "ok":
        if FORWARD.received or not notebook:
            return "ok", ""
        return NOTEBOOK_FAILED, f"the run finished ok; {detail}"
    if recorded and status == "preempted":
        why = (detail.partition(": ")[2] if detail.startswith("RunPreempted")
               else FORWARD.received)
        return "preempted", _joined(why, aside_line(cfg))
    if FORWARD.received:
        return "stopped", _joined("before it trained", aside_line(cfg))
    if status != "failed":                  # a process that died before writing its record
        from kit.train.provenance import environment    # torch: a batch loads it only here
        return "failed", _joined(detail, record_failed(cfg, detail,
                                                       environment=environment(processes)))
    return "failed", record.get("error") or detail


def _joined(*parts: str | None) -> str:
    return "; ".join(part for part in parts if part)


def _run_distributed(cfg: RunConfig, processes: int, grace_s: int, nodes: int = 1,
                     rdzv: str = "") -> tuple[str, str]:
    """One point on `processes` data-parallel processes per node (gloo on CPU, NCCL on GPUs):
    torchrun, on this node alone or on `nodes` nodes meeting at `rdzv` (kit.cluster.torchrun)."""
    import tempfile

    from kit.train.accel import cpu_threads     # torch: a batch of one process never loads it
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(cfg.to_dict(), f)
    cmd = torchrun_command(["-m", "kit.train.finetune", f.name], processes, grace_s, nodes,
                           rdzv, cfg.run_id)
    # torchrun warns unless the threads per process are set: share the cores between them
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get(
        "OMP_NUM_THREADS", str(cpu_threads(processes)))}
    before = _stamps(cfg)
    try:
        code, errors = run_torchrun(cmd, env)
    finally:
        os.unlink(f.name)
    if code == 0:
        return "ok", ""
    return outcome(cfg, errors[0] if errors else f"torchrun exit {code}", before,
                   processes=processes * nodes)


def failure_reason(err: Exception) -> str:
    """An error in one line: a notebook's `ename: evalue`, else the exception's type and text."""
    ename, evalue = getattr(err, "ename", None), getattr(err, "evalue", None)
    text = f"{ename}: {evalue}" if ename else f"{type(err).__name__}: {err}"
    return text.strip().splitlines()[0] if text.strip() else type(err).__name__
