"""The signals a batch passes on to the point that runs, and the one rule they follow.

The rule, for SIGTERM, SIGUSR1 and SIGINT (Ctrl-C) alike - kit.train.preemption.SIGNALS, their
one list: a batch (or kit.run) notes the first, starts no new point, and passes that same signal
on to the point that runs (each of them, K at once with --per-device: `Forwarder`), again
every RESEND_S, until the point's run has recorded how it ended. In the point's notebook kernel each of them does nothing but while fit()
runs (`ARM`), so a signal that lands in a cell before fit() - Ctrl-C too - cuts no cell and
reaches fit(), which stops after its step with a checkpoint (status preempted, exit 75); one
that comes after fit() has recorded a finished run is not passed on, and the notebook's last
cells run to their end. torchrun gets the signal once (kit.cluster.torchrun). docs/cluster.md
has the cases.
"""
from __future__ import annotations

import contextlib
import itertools
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass

from kit.train.preemption import SIGNALS      # what a run notes is what the batch passes on

RESEND_S = 0.2          # how soon a signal reaches a point whose kernel was idle or starting
# what a point gets between a signal and its end (SLURM's --signal B:USR1@S, torchrun's shutdown
# timeout): a checkpoint of a large model on a busy filesystem, with margin
DEFAULT_GRACE_S = 120

# Run once in every kernel at its start (kit.cluster.kernels): each of SIGNALS does nothing in
# the kernel but while fit() runs, which puts its own handlers (they note them:
# kit.train.preemption). IPython makes SIGINT raise KeyboardInterrupt again as every cell
# starts, so a pre_run_cell hook puts the handlers back there. A no-op handler, not SIG_IGN: an
# ignored signal would stay ignored in the processes a cell starts. Functions of no globals:
# %reset empties the namespace they are defined in.
ARM = f"""\
def _arm():
    import signal
    def not_in_fit(signum, frame):
        pass
    def arm(*info):
        for name in {[s.name for s in SIGNALS]!r}:
            signal.signal(signal.Signals[name], not_in_fit)
    arm()
    get_ipython().events.register("pre_run_cell", arm)
_arm()
del _arm
"""


@dataclass
class _Point:
    send: Callable[[str], None]          # the signal, by name, to the point's process
    settled: Callable[[], bool]          # the point's run has recorded how it ended
    once: bool                           # torchrun: one signal (a second cuts its grace short)
    sent: bool = False


class Forwarder:
    """The batch's side of a preemption (kit.train.preemption has the run's). The first of
    SIGNALS is noted (`received`: the batch starts no new point) and passed on, as that signal,
    to every point that runs (one, or K with --per-device: kit.cluster.pool). The handler only
    notes it; a thread passes it on, and again every RESEND_S, until each point's run has
    recorded its end: one that reaches a kernel between two cells or in the cells before fit()
    (which ignore SIGNALS: ARM) gets to fit() as soon as it runs, and one that lands after fit()
    has recorded a finished run is not passed on (the notebook's last cells run to their end). torchrun gets it once. The batch itself checks
    `received` before a point and once its kernel is ready (kit.batch)."""

    def __init__(self):
        self.received: str | None = None
        self._points: dict[int, _Point] = {}        # the running points, by their block
        self._keys = itertools.count()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def __call__(self, signum, frame) -> None:     # a signal handler: note, and never block
        self.received = self.received or signal.Signals(signum).name
        self._wake.set()

    @contextlib.contextmanager
    def point(self, send: Callable[[str], None], settled: Callable[[], bool] = lambda: False,
              once: bool = False):
        """A point runs in the block: signals go to `send` (see _Point). Blocks of several
        threads may be open at once (K points at once)."""
        key = next(self._keys)
        self._points[key] = _Point(send, settled, once)
        try:
            yield
        finally:
            self._points.pop(key, None)

    def _pass_on(self) -> None:
        while self._thread is not None:
            # cleared once woken: an event left set would make this loop spin a core (and, by
            # holding the GIL, slow the batch's own work) for the rest of the process
            if self._wake.wait(RESEND_S):
                self._wake.clear()
            for point in list(self._points.values()):
                if self.received and not point.sent and not point.settled():
                    with contextlib.suppress(OSError):
                        point.send(self.received)
                    point.sent = point.once

    def __enter__(self) -> Forwarder:
        self.received, self._points = None, {}
        self._wake.clear()
        self._thread = threading.Thread(target=self._pass_on, name="ssa-kit signals", daemon=True)
        self._thread.start()
        self._previous = {s: signal.signal(s, self) for s in SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        thread, self._thread = self._thread, None
        self._wake.set()
        thread.join(timeout=5)
        # the batch has read it: a point run later in this process, outside a batch, must not
        # see this batch's signal and call itself stopped
        self.received = None


FORWARD = Forwarder()


def forwarding_signals() -> Forwarder:
    """`with forwarding_signals() as signals:` FORWARD handles SIGNALS while the block runs (a
    batch, kit.run)."""
    return FORWARD
