"""Stopping on a scheduler's signal: SIGTERM, SIGUSR1 (SLURM's `--signal`) and SIGINT (Ctrl-C).

A handler only notes the signal; the loop (kit.train.loop) looks at the note after every step,
finishes nothing more than that step, writes a mid-epoch checkpoint and raises kit.runs.
RunPreempted, which the outputs contract records as status `preempted` (not `failed`) and the
doors turn into exit status 75 (EX_TEMPFAIL: "try again"), the status a job script requeues on.

With several processes every rank must stop at the same step, or the checkpoint would mix
ranks from different steps: `Stop.agreed` all-reduces (sums) the note of every rank together with
the main process's "a checkpoint is due" clock, so a signal to any one rank (or to torchrun,
which passes SIGTERM / SIGINT on to every worker) stops all of them after the same step, and
the time-based checkpoints happen on the same step everywhere though the ranks' clocks differ.

A pass over data that is not training - SSA label generation, evaluation, test prediction - looks
at the note between its batches (`Stop.requested`) and raises `Interrupted`; the loop turns that
into a checkpoint (or none, where the last one already holds everything) and RunPreempted, so a
signal never waits for the rest of a pass over MNLI's dev set.
"""
from __future__ import annotations

import contextlib
import datetime
import signal
import socket
import threading
import time
from pathlib import Path

SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)
PREEMPTED_EXIT = 75          # sysexits.h EX_TEMPFAIL: a temporary failure, retry later


class Interrupted(Exception):
    """A pass over data (SSA probing, evaluation, test prediction) stopped between two batches
    on a signal; kit.train.loop turns it into RunPreempted."""


class Stop:
    """What the handlers noted (`signal`: the first signal's name, or None) and the clock of the
    time-based checkpoints."""

    def __init__(self, every_minutes: float = 0.0, every_steps: int = 0):
        self.signal: str | None = None
        self.every_s, self.every_steps = every_minutes * 60, every_steps
        self.last_checkpoint = time.monotonic()

    def note(self, signum, frame=None) -> None:
        if self.signal is None:
            self.signal = signal.Signals(signum).name

    def checkpointed(self) -> None:
        self.last_checkpoint = time.monotonic()

    def due(self, step: int) -> bool:
        """A checkpoint is due after optimizer step `step` (this process's clock)."""
        by_steps = self.every_steps > 0 and step % self.every_steps == 0
        by_time = self.every_s > 0 and time.monotonic() - self.last_checkpoint >= self.every_s
        return by_steps or by_time

    def where(self, epoch: int, batch: int | None, step: int, checkpoint: Path | None,
              during: str = "training") -> dict:
        """What metrics.json records of the stop: the signal, when, on which host, and where
        the run resumes (`epoch`: 0-based here, counted from 1 in the record as in the progress
        lines; `batch`: batches of that epoch done; `during`: training, label generation,
        evaluation, epoch end (the epoch's bookkeeping and checkpoint) or test prediction).
        `checkpoint` is None only when the run stopped before its first checkpoint, having
        trained nothing: rerunning starts it afresh, losing nothing."""
        return {"signal": self.signal,
                "at": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
                "host": socket.gethostname(), "epoch": epoch + 1, "batch": batch, "step": step,
                "during": during,
                "checkpoint": str(checkpoint) if checkpoint and checkpoint.is_dir() else None}

    def agreed(self, step: int, accelerator) -> tuple[bool, bool]:
        """(stop, checkpoint due) after `step`, the same on every rank: stop if any rank was
        signalled; due by the main process's clock (or the step count). One process: no
        collective."""
        stop, due = self.signal is not None, self.due(step)
        if accelerator.num_processes == 1:
            return stop, due
        return tuple(self._summed([stop, due and accelerator.is_main_process], accelerator))

    def requested(self, state) -> bool:
        """Whether any rank was signalled, the same answer on every rank: asked between the
        batches of a pass that every rank runs in step (`state`: the Accelerator or accelerate's
        PartialState). One process: no collective."""
        if state.num_processes == 1:
            return self.signal is not None
        return self._summed([self.signal is not None], state)[0]

    def _summed(self, flags: list[bool], state) -> list[bool]:
        """Each flag: set on any rank (an all-reduce sum). The first says this rank was
        signalled: set elsewhere only, the stop is noted as another rank's. (torch imported
        here, the one place that needs it: a batch process imports this module for its signals
        and loads no torch.)"""
        import torch
        from accelerate.utils import reduce
        total = reduce(torch.tensor([float(f) for f in flags], device=state.device), "sum")
        if total[0] and self.signal is None:
            self.signal = "a signal to another rank"
        return [bool(f) for f in total]

    def between_batches(self, state) -> None:
        """Raise Interrupted if a stop was requested (`requested`)."""
        if self.requested(state):
            raise Interrupted(self.signal)


@contextlib.contextmanager
def catching(stop: Stop):
    """Route SIGTERM / SIGUSR1 / SIGINT to `stop.note` while the block runs, then restore the
    previous handlers (a warm notebook kernel goes on with its own). Signal handlers can only be
    set from the main thread; elsewhere the block runs without them."""
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    previous = {s: signal.signal(s, stop.note) for s in SIGNALS}
    try:
        yield stop
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)

