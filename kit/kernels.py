"""Where a batch runs its points - one warm notebook kernel, point after point, or torchrun for a
data-parallel point - and how a scheduler's signal reaches the point that runs.

A fresh kernel per point pays its start and the imports of torch, transformers and the kit
again: 3.8-4.4 s of CPU per point on 2 cores (bench/point_overhead.py), more than a smoke run's
training. A batch therefore keeps one kernel and runs its points in it one after another:

- between points the kernel's namespace is cleared (IPython's %reset) and garbage-collected; what
  stays is the imported modules. Every point seeds its own RNGs and builds its own model, optimizer
  and Accelerator (kit.train.accel lets the precision change), so a point's results are bit for bit
  those of a fresh kernel (tests/test_batch.py runs the same points both ways);
- a point that fails (an error in the notebook, a dead kernel) takes its kernel with it: the next
  point starts a fresh one, so no half-finished state is carried on (a run stopped by a signal
  ends cleanly: its kernel stays);
- `fresh=True` (`python -m kit.batch --fresh-kernels`) starts a kernel per notebook, as papermill
  does on its own.

Every point still gets its own executed notebook (papermill writes it as before).

Signals (`Forwarder`): the batch passes the signal it got on to the running point, as that same
signal, until the point's run has taken it; docs/cluster.md has the cases it covers.
"""
from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from jupyter_client.manager import AsyncKernelManager
from jupyter_core.utils import run_sync

from kit.config.paths import PROJECT as REPO      # kernels start in the project folder
from kit.train import progress as kprogress
from kit.train.preemption import SIGNALS      # what a run notes is what the batch passes on

# papermill -> nbformat -> jsonschema builds lark grammars for its optional IRI format checks when
# rfc3987_syntax is installed (jupyter's extras install it): 0.75 s of every batch's start
# (papermill imports in 1.05 s, 0.29 s without it). Notebooks are validated without format
# checks, so the batch process does without that optional module.
sys.modules.setdefault("rfc3987_syntax", None)

# Kernel log lines (the TCP-without-encryption warning at start, a KeyboardInterrupt line when
# a kernel is stopped) are not about the run: keep only the kernel's critical errors.
KERNEL_ARGS = ["--IPKernelApp.log_level=CRITICAL"]
KERNEL_NAME = "python3"
# run between two points in the warm kernel: the next point starts from an empty namespace
# (%reset also garbage-collects, through IPython's displayhook)
RESET = "get_ipython().run_line_magic('reset', '-f')"
# run once in every kernel at its start: SIGUSR1 and SIGTERM do nothing in a kernel but while
# fit() runs, which puts its own handlers (they note them: kit.train.preemption). A batch passes
# on the very signal it got, again until the run has it (kit.kernels.Forwarder), so a run's
# record names it and no cell before or after fit() is cut. A function of no globals: %reset
# empties the namespace it is defined in.
ARM = """\
import signal as _signal
def _not_in_fit(signum, frame):
    pass
for _s in (_signal.SIGUSR1, _signal.SIGTERM):
    _signal.signal(_s, _not_in_fit)
del _signal, _s, _not_in_fit
"""


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


class _Manager(AsyncKernelManager):
    """A kernel manager that remembers the clients made of it: nbclient makes one per notebook
    and leaves it open when it does not own the kernel (its heartbeat thread would run on)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.open_clients = []

    def client(self, **kwargs):
        client = super().client(**kwargs)
        self.open_clients.append(client)
        return client

    def close_clients(self) -> None:
        for client in self.open_clients:
            client.stop_channels()
        self.open_clients = []


class Kernels:
    """Runs notebooks through papermill in one reused kernel (or, fresh=True, one each).
    Use as a context manager: the warm kernel is shut down at the end. `env`: variables set in
    the warm kernels it starts, over this process's environment (fresh ones get this process's)."""

    def __init__(self, fresh: bool = False, env: dict[str, str] | None = None):
        if fresh and env:
            raise ValueError("env applies to warm kernels only (papermill starts fresh ones)")
        self.fresh, self.env = fresh, env or {}
        self._manager: _Manager | None = None
        self._busy = False                   # a notebook runs: signals may reach it
        self._lock = threading.Lock()        # `signal` (another thread) vs. the end of a notebook

    def __enter__(self) -> Kernels:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def execute(self, notebook: Path, output: Path, parameters: dict, stderr_file) -> None:
        """Execute `notebook` with `parameters` into `output`; raises what papermill raises
        (the kernel is then discarded, unless the run in it stopped on a signal)."""
        import papermill as pm
        run = functools.partial(pm.execute_notebook, str(notebook), str(output),
                                parameters=parameters, kernel_name=KERNEL_NAME,
                                progress_bar=False, cwd=str(REPO), stderr_file=stderr_file,
                                extra_arguments=KERNEL_ARGS)
        manager = self._warm()      # fresh too: a kernel of ours, so `signal` reaches it
        failed = False
        try:
            self._set_busy(True)
            run(km=manager)
        except BaseException as err:
            # a run that stopped on a signal raised in a sound kernel; anything else: not reused
            failed = getattr(err, "ename", None) != "RunPreempted"
            raise
        finally:
            self._set_busy(False)
            manager.close_clients()
            self._after(manager, failed)

    def _after(self, manager: _Manager, failed: bool) -> None:
        """A fresh or failed point's kernel is shut down; a warm one is reset for the next."""
        if failed or self.fresh:
            self.close()
            return
        try:
            _run_quietly(manager, RESET)
        except Exception:           # the point is done; only its kernel is not reused
            self.close()

    def start(self) -> None:
        """Have a kernel ready (the warm one, or a new one) before a point is handed to it."""
        self._warm()

    def _set_busy(self, busy: bool) -> None:
        with self._lock:
            self._busy = busy

    def signal(self, name: str) -> None:
        """Signal `name` (SIGUSR1, SIGTERM, SIGINT) to the kernel while it runs a notebook;
        nothing between notebooks (the kernel is then reset or shut down). Thread-safe. A
        kernel sits in a session of its own, so a signal to the batch does not reach it."""
        with self._lock:
            pid = self._busy and getattr(getattr(self._manager, "provisioner", None), "pid", None)
            if pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.Signals[name])

    def close(self) -> None:
        manager, self._manager = self._manager, None
        if manager is not None:
            manager.close_clients()
            run_sync(manager.shutdown_kernel)(now=True)

    def _warm(self) -> _Manager:
        if self._manager is not None and not run_sync(self._manager.is_alive)():
            self.close()
        if self._manager is None:
            manager = _Manager(kernel_name=KERNEL_NAME)
            run_sync(manager.start_kernel)(extra_arguments=KERNEL_ARGS, cwd=str(REPO),
                                           env={**os.environ, **self.env})
            try:
                _run_quietly(manager, ARM)
            except BaseException:
                run_sync(manager.shutdown_kernel)(now=True)
                raise
            self._manager = manager
        return self._manager


def _run_quietly(manager: _Manager, code: str, timeout: float = 120) -> None:
    """Run `code` in the kernel and wait for its reply, on the shell channel only (waiting for
    the output channel to connect costs 0.2 s); an error raises RuntimeError."""
    from jupyter_client import BlockingKernelClient
    client = BlockingKernelClient()
    client.load_connection_info(manager.get_connection_info())
    client.start_channels(iopub=False, stdin=False, hb=False, control=False)
    try:
        msg_id = client.execute(code, silent=True, store_history=False)
        reply = client.get_shell_msg(timeout=timeout)
        while reply["parent_header"].get("msg_id") != msg_id:
            reply = client.get_shell_msg(timeout=timeout)
    finally:
        client.stop_channels()
    if reply["content"]["status"] != "ok":
        raise RuntimeError(f"the kernel refused {code.splitlines()[0]!r}: "
                           f"{reply['content'].get('evalue')}")


# ---------------------------------------------------------------- signals to the running point

RESEND_S = 0.2          # how soon a signal reaches a point whose kernel was idle or starting


@dataclass
class _Point:
    send: Callable[[str], None]          # the signal, by name, to the point's process
    settled: Callable[[], bool]          # the point's run has recorded how it ended
    once: bool                           # torchrun: one signal (a second cuts its grace short)
    sent: bool = False


class Forwarder:
    """The batch's side of a preemption (kit.train.preemption has the run's). The first SIGTERM,
    SIGUSR1 or SIGINT is noted (`received`: the batch starts no new point) and passed on, as
    that signal, to the point that runs. The handler only notes it; a thread passes it on, and
    again every RESEND_S, until the point's run has recorded its end: one that reaches a kernel
    between two cells or in the cells before fit() (which ignore SIGUSR1 and SIGTERM: ARM) gets
    to fit() as soon as it runs, and one that lands after fit() has recorded a finished run is
    not passed on (the notebook's last cells run to their end). torchrun gets it once. The batch
    itself checks `received` before a point and once its kernel is ready (kit.batch)."""

    def __init__(self):
        self.received: str | None = None
        self._point: _Point | None = None
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def __call__(self, signum, frame) -> None:     # a signal handler: note, and never block
        self.received = self.received or signal.Signals(signum).name
        self._wake.set()

    @contextlib.contextmanager
    def point(self, send: Callable[[str], None], settled: Callable[[], bool] = lambda: False,
              once: bool = False):
        """A point runs in the block: signals go to `send` (see _Point)."""
        self._point = _Point(send, settled, once)
        try:
            yield
        finally:
            self._point = None

    def _pass_on(self) -> None:
        while self._thread is not None:
            # cleared once woken: an event left set would make this loop spin a core (and, by
            # holding the GIL, slow the batch's own work) for the rest of the process
            if self._wake.wait(RESEND_S):
                self._wake.clear()
            point = self._point
            if self.received and point and not point.sent and not point.settled():
                with contextlib.suppress(OSError):
                    point.send(self.received)
                point.sent = point.once

    def __enter__(self) -> Forwarder:
        self.received, self._point = None, None
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


FORWARD = Forwarder()


def forwarding_signals() -> Forwarder:
    """`with forwarding_signals() as signals:` FORWARD handles SIGTERM / SIGUSR1 / SIGINT while
    the block runs (a batch, kit.run)."""
    return FORWARD


# ---------------------------------------------------------------- torchrun

# torchrun passes these on to its workers; SIGUSR1 (SLURM's warning) needs --signals-to-handle,
# or it would kill torchrun: a torchrun without that option gets SIGTERM instead
TORCHRUN_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"


@functools.cache
def torchrun_knows(option: str) -> bool:
    """Whether the installed torchrun has `option`, read from its source (importing torch to
    ask would cost the batch seconds)."""
    spec = importlib.util.find_spec("torch")
    run_py = Path(spec.origin).parent / "distributed" / "run.py" if spec and spec.origin else None
    try:
        return run_py is not None and f'"{option}"' in run_py.read_text()
    except OSError:
        return False


def torchrun_command(script: list[str], processes: int, grace_s: int, nodes: int = 1,
                     rdzv: str = "", rdzv_id: str = "") -> list[str]:
    """torchrun of `script` (e.g. ["-m", "kit.train.finetune", CONFIG]) on `processes` per node:
    on this node alone, or on `nodes` nodes meeting at `rdzv` (c10d, under `rdzv_id`). After a
    signal torchrun gives its workers `grace_s` to stop before it kills them (--shutdown-timeout;
    without it, in older torch, 30 s whatever the scheduler allows: docs/cluster.md)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={processes}"]
    if nodes > 1:
        cmd[3:4] = [f"--nnodes={nodes}", "--rdzv-backend=c10d", f"--rdzv-endpoint={rdzv}",
                    f"--rdzv-id={rdzv_id}"]
    if torchrun_knows("--shutdown-timeout"):
        cmd.append(f"--shutdown-timeout={grace_s}")
    if torchrun_knows("--signals-to-handle"):
        cmd.append(f"--signals-to-handle={TORCHRUN_SIGNALS}")
    return cmd + script


def torchrun_signal(name: str) -> str:
    """The signal torchrun gets for the batch's `name`: the same, unless it cannot take it."""
    return name if name != "SIGUSR1" or torchrun_knows("--signals-to-handle") else "SIGTERM"


def run_torchrun(cmd: list[str], env: dict[str, str]) -> tuple[int, list[str]]:
    """Run torchrun (`cmd`), streaming its workers' progress lines to this terminal; returns
    its exit status and the workers' one-line failures (`error: ...`, kit.train.finetune)."""
    errors, echo = [], True
    with subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True) as proc:
        send = lambda name: proc.send_signal(signal.Signals[torchrun_signal(name)])  # noqa: E731
        with FORWARD.point(send, settled=lambda: proc.poll() is not None, once=True):
            for line in proc.stderr:         # the ranks' progress lines, as they come
                if line.startswith("error: "):
                    errors.append(line.strip().removeprefix("error: "))
                    continue
                echo = echo and "Traceback" not in line and "ChildFailedError" not in line
                if echo:
                    sys.stderr.write(line)
    return proc.returncode, errors
