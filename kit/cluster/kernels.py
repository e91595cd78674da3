"""The warm notebook kernel a batch runs its points in, one after another.

A fresh kernel per point pays its start and the imports of torch, transformers and the kit
again: 3.8-4.4 s of CPU per point on 2 cores (bench/point_overhead.py), more than a smoke run's
training. A batch therefore keeps one kernel and runs its points in it one after another:

- between points the kernel's namespace is cleared (IPython's %reset) and garbage-collected; what
  stays is the imported modules. Every point seeds its own RNGs and builds its own model, optimizer
  and Accelerator (kit.train.accel lets the precision change), so a point's results are bit for bit
  those of a fresh kernel (tests/test_batch.py runs the same points both ways);
- a point that fails (an error in the notebook, a dead kernel) takes its kernel with it: the next
  point starts a fresh one, so no half-finished state is carried on (a run stopped by a signal
  ends cleanly, and a results notebook's NoRuns is a refusal to read, made before anything:
  their kernel stays);
- `fresh=True` (`python -m kit.batch --fresh-kernels`) starts a kernel per notebook, as papermill
  does on its own.

Every point still gets its own executed notebook (papermill writes it as before). Each kernel is
armed as it starts (kit.cluster.signals.ARM): the signals a batch passes on do nothing in it but
while fit() runs.
"""
from __future__ import annotations

import contextlib
import functools
import os
import queue
import signal
import threading
from pathlib import Path

from jupyter_client.manager import AsyncKernelManager
from jupyter_core.utils import run_sync

from kit.cluster.signals import ARM
from kit.config.paths import PROJECT as REPO      # kernels start in the project folder
from kit.train import progress as kprogress

# Kernel log lines (the TCP-without-encryption warning at start, a KeyboardInterrupt line when
# a kernel is stopped) are not about the run: keep only the kernel's critical errors.
KERNEL_ARGS = ["--IPKernelApp.log_level=CRITICAL"]
KERNEL_NAME = "python3"
# run between two points in the warm kernel: the next point starts from an empty namespace
# (%reset also garbage-collects, through IPython's displayhook); what survives it (the imported
# modules) is then frozen out of the collector, so that no later collection (the next reset's,
# the automatic ones while a point runs) walks the millions of objects of torch and
# transformers again: ~0.2 s of CPU a notebook
RESET = "get_ipython().run_line_magic('reset', '-f'); __import__('gc').freeze()"
# what a notebook may raise and leave its kernel sound (kit.runs.RunPreempted: a run stopped on a
# signal, cleanly; kit.results.frame.no_runs.NoRuns: nothing to show, said before any work)
SOUND_ERRORS = ("RunPreempted", "NoRuns")


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
        self.label = ""      # K > 1 (kit.cluster.pool): each line the point's kernel writes starts so
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
        if self.label and stderr_file is not None:
            stderr_file = Labelled(stderr_file, self.label)
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
            # a run that stopped on a signal, and a results notebook with nothing to show, raised
            # in a sound kernel; anything else: not reused
            failed = getattr(err, "ename", None) not in SOUND_ERRORS
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
        """Have a kernel ready (the warm one, or a new one) before a point is handed to it;
        raises what stops one from starting (kit.cluster.point makes that the point's failure)."""
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


class Labelled:
    """A stream whose every line starts with `label`: the progress lines of K points at once,
    interleaved on one terminal, say whose they are."""

    def __init__(self, stream, label: str):
        self.stream, self.label, self.at_start = stream, label, True

    def write(self, text: str) -> None:
        out = []
        for part in text.splitlines(keepends=True):
            out.append((self.label if self.at_start else "") + part)
            self.at_start = part.endswith(("\n", "\r"))
        self.stream.write("".join(out))

    def flush(self) -> None:
        self.stream.flush()


def _run_quietly(manager: _Manager, code: str, timeout: float = 120) -> None:
    """Run `code` in the kernel and wait for its reply, on the shell channel only (waiting for
    the output channel to connect costs 0.2 s); an error raises RuntimeError, no reply within
    `timeout` (a kernel that died) TimeoutError."""
    from jupyter_client import BlockingKernelClient
    client = BlockingKernelClient()
    client.load_connection_info(manager.get_connection_info())
    client.start_channels(iopub=False, stdin=False, hb=False, control=False)
    try:
        msg_id = client.execute(code, silent=True, store_history=False)
        reply = client.get_shell_msg(timeout=timeout)
        while reply["parent_header"].get("msg_id") != msg_id:
            reply = client.get_shell_msg(timeout=timeout)
    except queue.Empty:
        raise TimeoutError(f"the kernel did not answer in {timeout:.0f} s") from None
    finally:
        client.stop_channels()
    if reply["content"]["status"] != "ok":
        raise RuntimeError(f"the kernel refused {code.splitlines()[0]!r}: "
                           f"{reply['content'].get('evalue')}")
