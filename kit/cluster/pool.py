"""The points of a batch, one at a time or K at once on one device (`--per-device K`, a profile's
`per_device:`), with the same lines, outcomes and stops either way.

K = 1 (the default) runs the points one after another in the batch's own kernel, in the calling
thread, in grid order: the batch as it always was. K > 1 runs K slots, each a thread of the
batch driving a notebook kernel of its own (a process: its imports, model, optimizer and
device memory are its own), started with cores / K torch threads (OMP_NUM_THREADS, unless the
batch's environment sets it: then each point gets that many), so K points do not oversubscribe
a CPU; on a GPU the K kernels share it. A slot takes a whole chain (kit.config.grids.chains: a
point that reads another point's output runs after it, in that slot), so no two points of a
chain ever run at once. A signal reaches every running point (kit.cluster.signals passes it on
to each), no slot starts a point after it, and the batch stops as with one point
(kit.cluster.tally.stopped, over every point it stopped). Points another batch holds are tried
again at the end, until --lock-wait, as before.
"""
from __future__ import annotations

import collections
import os
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

from kit.cluster import tally
from kit.cluster.kernels import Kernels
from kit.cluster.point import NOTEBOOK_FAILED
from kit.cluster.signals import FORWARD
from kit.config.grids import chains, outside_sources, point_label, sources
from kit.config.profiles import Profile
from kit.config.run_config import ConfigError, RunConfig
from kit.runs import blocked_source, finished_metrics, record_blocked

LOCK_POLL_S = 2.0       # how often a batch looks again at the points another batch holds
Unit = list[tuple[int, dict]]       # points (numbered 1.. in the batch's order) one slot runs
FINISHED = ("ok", "skipped", NOTEBOOK_FAILED)     # a source whose output its readers may use
SOURCE_WHY = {"failed": "failed", "blocked": "was blocked", "absent": "is absent (task files "
              "missing)", None: "has not run (it comes later in the grid?)"}


@dataclass
class Batch:
    """What the points of one batch come to, shared by its slots (`lock` guards it and the
    terminal's lines): the outcome counts, the points held by another batch, the finished runs
    whose notebook failed, the points a signal stopped, and whether to start no more points."""
    profile: Profile
    points: list[dict]
    absent: dict[str, str]                          # run id: why its task files are missing
    run: Callable[[dict, Kernels], tuple[str, str]]     # a point in a kernel: (status, detail)
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(tally.OUTCOMES, 0))
    started: float = field(default_factory=time.perf_counter)
    ran: int = 0                # points that ran to an end (the ETA's rate)
    seen: int = 0               # points handled in the first round (the ETA's remainder)
    held: Unit = field(default_factory=list)
    notebooks: list[RunConfig] = field(default_factory=list)
    stopped: list[RunConfig] = field(default_factory=list)
    halted: bool = False
    first_round: bool = True
    lock: threading.Lock = field(default_factory=threading.Lock)
    outcomes: dict[int, str] = field(default_factory=dict)     # point (1-based): its outcome
    per_device: int = 1                 # K points at once (run_all sets it)
    errors: list[str] = field(default_factory=list)     # slots ended by the batch's own error

    def __post_init__(self):
        # the points each point reads the output of (labels, an adapted model), 1-based
        self.sources = {i + 1: [j + 1 for j in js] for i, js in sources(self.points).items()}
        # the run folder a point reads labels from when no point of this batch is that run
        self.outside = {i + 1: folder for i, folder in outside_sources(self.points).items()}

    def may_start(self) -> bool:
        """No new point after a signal, or once a point was stopped."""
        with self.lock:
            self.halted = self.halted or FORWARD.received is not None
            return not self.halted

    def point(self, i: int, point: dict, kernels: Kernels) -> None:
        """Run point i (1-based) in `kernels`, with its lines: `started`, then its outcome."""
        cfg = RunConfig.from_dict(point)
        head = f"[{i}/{len(self.points)}] {point_label(cfg.to_dict())}"
        t0 = time.perf_counter()
        if cfg.run_id in self.absent:
            status, detail = "absent", self.absent[cfg.run_id]
        elif (waits := self._source_not_ok(i, cfg)) is not None:
            status, detail = waits
        else:
            if finished_metrics(cfg) is None and self.first_round:
                self._say(f"{head}: started")
            if self.per_device > 1 and kernels is not None:   # its lines, among K points'
                kernels.label = f"[{i}/{len(self.points)}] "
            status, detail = self.run(point, kernels)
            if status == "failed" and self.per_device > 1 and "out of memory" in detail.lower():
                detail += (f"; {self.per_device} points shared the device (--per-device "
                           f"{self.per_device}): fewer at once may fit")
        with self.lock:
            self.seen += self.first_round
            self.outcomes[i] = status
            if status == "held":
                self.held.append((i, point))
                if self.first_round:
                    print(f"{head}: held ({detail}): waited for at the end", flush=True)
                return
            self.counts[status] += 1
            self.ran += status in tally.TRAINED
            self.notebooks += [cfg] if status == NOTEBOOK_FAILED else []
            left = max(0, len(self.points) - self.seen)
            print(f"{head}: {status}{f' ({detail})' if detail else ''} "
                  f"{time.perf_counter() - t0:.0f}s{tally.eta(self.started, self.ran, left)}",
                  flush=True)
            if status in ("preempted", "stopped"):
                self.stopped.append(cfg)
                self.halted = True

    def _source_not_ok(self, i: int, cfg: RunConfig) -> tuple[str, str] | None:
        """("blocked", why) for a point whose source did not finish ok (recorded in its
        metrics.json, never trained on a fallback), ("held", why) while another batch holds the
        source; None when it may run (or has finished: it is skipped as ever). A source's
        outcome in this batch decides, else its record (a source run by an earlier batch); a
        source outside the batch (--only left it out) by its record alone: a run that failed
        in its last epoch has saved its earlier epochs' labels all the same."""
        if (i not in self.sources and i not in self.outside) or (
                finished_metrics(cfg) is not None and not cfg.rerun):
            return None
        for j in self.sources.get(i, []):
            source = RunConfig.from_dict(self.points[j - 1])
            with self.lock:
                status = self.outcomes.get(j)
            if status in FINISHED or (status is None and finished_metrics(source) is not None):
                continue
            if status == "held":
                return "held", f"its source {source.run_id} is held by another batch"
            return _blocked(cfg, f"source {point_label(source.to_dict())} "
                                 f"{SOURCE_WHY.get(status, status)}", source.run_id)
        if i in self.outside and (why := blocked_source(self.outside[i])) is not None:
            return _blocked(cfg, why, self.outside[i].name)
        return None

    def _say(self, line: str) -> None:
        with self.lock:
            print(line, flush=True)


def _blocked(cfg: RunConfig, line: str, source: str) -> tuple[str, str]:
    """("blocked", line), its record written (kit.runs.record_blocked); ("held", why) when
    another batch holds the point."""
    if not record_blocked(cfg, line, source):
        return "held", "running in another batch"
    return "blocked", line


def run_all(batch: Batch, kernels: Kernels, per_device: int, fresh: bool,
            lock_wait_s: float) -> bool:
    """Run the batch's points, `per_device` at once (1: in `kernels`, this thread); points held
    by another batch again until `lock_wait_s` has passed. False when a signal (or a stopped
    point) ended it early: batch.stopped has the points it stopped."""
    numbered = list(enumerate(batch.points, 1))
    batch.per_device = per_device
    if per_device == 1:
        units = [[p] for p in numbered]      # one after another, in grid order
    else:
        place = {id(point): (i, point) for i, point in numbered}
        units = [[place[id(p)] for p in chain] for chain in chains(batch.points)]
    deadline = None
    while units:                 # a second round and on: the points another batch held
        batch.held = []
        run_units(batch, units, kernels, per_device, fresh)
        if batch.halted:
            return False
        deadline = deadline or time.monotonic() + lock_wait_s
        units = (again(batch.held, per_device)
                 if batch.held and time.monotonic() < deadline else [])
        time.sleep(max(0.0, min(LOCK_POLL_S, deadline - time.monotonic())) if units else 0)
        batch.first_round = False
    return True


def again(held: Unit, per_device: int) -> list[Unit]:
    """The held points as the next round's units: one each in order with one slot, else whole
    chains, so a point held with its source still runs after it."""
    if per_device == 1:
        return [[p] for p in held]
    place = {id(point): (i, point) for i, point in held}
    return [[place[id(p)] for p in chain] for chain in chains([p for _, p in held])]


def run_units(batch: Batch, units: list[Unit], kernels: Kernels, per_device: int,
              fresh: bool) -> None:
    """Each unit's points in order, `per_device` units at once: one slot runs in this thread
    with `kernels`; several each in a thread of their own with a kernel of their own."""
    queue = collections.deque(units)

    def take() -> Unit | None:
        with batch.lock:
            return queue.popleft() if queue else None

    def work(kernels: Kernels) -> None:
        while (unit := take()) is not None:
            for i, point in unit:
                if not batch.may_start():
                    return
                batch.point(i, point, kernels)
                if fresh and per_device > 1:    # slots' kernels are warm ones: a new one each
                    kernels.close()

    if per_device == 1:
        work(kernels)
        return
    # each kernel knows K: its runs record it (kit.train.provenance.points_per_device)
    env = {"OMP_NUM_THREADS": threads_per_point(per_device), "SSA_KIT_PER_DEVICE": str(per_device)}

    def slot() -> None:
        # made, used and shut down in this thread: a kernel manager's sockets live in the
        # event loop of the thread that made it
        try:
            with Kernels(env=env) as own:
                work(own)
        except BaseException as err:    # the batch's bug, not a point's: the other slots take
            with batch.lock:            # its points; the batch still ends with its summary
                traceback.print_exc()
                batch.errors.append(f"{threading.current_thread().name}: "
                                    f"{type(err).__name__}: {err}".splitlines()[0])

    threads = [threading.Thread(target=slot, name=f"ssa-kit slot {n}", daemon=True)
               for n in range(min(per_device, len(units)))]
    for thread in threads:
        thread.start()
    for thread in threads:
        while thread.is_alive():        # in short waits: the signal handler runs in between
            thread.join(0.5)
    if queue and not batch.halted:      # every slot ended on an error: the rest, one by one here
        work(kernels)


def refuse_mixed(per_device: int, processes: int, nodes: int, source: str) -> None:
    """One rule for K, wherever it was set (`source`: the command line, a profile, a frozen
    grid): K > 1 runs several points on one device, --processes / --nodes one point on several."""
    if per_device > 1 and (processes > 1 or nodes > 1):
        raise ConfigError(f"per_device {per_device} ({source}) runs several points on one device; "
                          "--processes and --nodes run one point on several: choose one")


def threads_per_point(per_device: int) -> str:
    """Each of K points' torch threads: OMP_NUM_THREADS when the batch's environment sets it
    (the user's count per process, as under torchrun), else this job's CPUs shared out by K."""
    if os.environ.get("OMP_NUM_THREADS"):
        return os.environ["OMP_NUM_THREADS"]
    from kit.train.accel import cpu_threads     # torch: a batch of K = 1 never loads it
    return str(cpu_threads(per_device))
