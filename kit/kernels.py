"""The notebook kernel a batch runs its points in: one warm kernel, point after point.

A fresh kernel per point pays its start and the imports of torch, transformers and the kit
again: 3.8-4.4 s of CPU per point on 2 cores (bench/point_overhead.py), more than a smoke run's
training. A batch therefore keeps one kernel and runs its points in it one after another:

- between points the kernel's namespace is cleared (IPython's %reset) and garbage-collected; what
  stays is the imported modules. Every point seeds its own RNGs and builds its own model, optimizer
  and Accelerator (kit.train.accel lets the precision change), so a point's results are bit for bit
  those of a fresh kernel (tests/test_batch.py runs the same points both ways);
- a point that fails (an error in the notebook, a dead kernel) takes its kernel with it: the next
  point starts a fresh one, so no half-finished state is carried on;
- `fresh=True` (`python -m kit.batch --fresh-kernels`) starts a kernel per notebook, as papermill
  does on its own.

Every point still gets its own executed notebook (papermill writes it as before).
"""
from __future__ import annotations

import functools
import os
import signal
import sys
from pathlib import Path

from jupyter_client.manager import AsyncKernelManager
from jupyter_core.utils import run_sync

from kit.config.profiles import REPO

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

    def __enter__(self) -> Kernels:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def execute(self, notebook: Path, output: Path, parameters: dict, stderr_file) -> None:
        """Execute `notebook` with `parameters` into `output`; raises what papermill raises
        (the kernel is then discarded)."""
        import papermill as pm
        run = functools.partial(pm.execute_notebook, str(notebook), str(output),
                                parameters=parameters, kernel_name=KERNEL_NAME,
                                progress_bar=False, cwd=str(REPO), stderr_file=stderr_file,
                                extra_arguments=KERNEL_ARGS)
        manager = self._warm()      # fresh too: a kernel of ours, so `interrupt` reaches it
        try:
            run(km=manager)
        except BaseException:
            self.close()            # a failed point's kernel is not reused
            raise
        finally:
            manager.close_clients()
        if self.fresh:
            self.close()
            return
        try:
            _reset(manager)
        except Exception:           # the point is done; only its kernel is not reused
            self.close()

    def interrupt(self) -> None:
        """SIGINT to the warm kernel, if one runs: a run in it stops after its current step
        with a checkpoint (kit.train.preemption); an idle kernel ignores it. Safe to call from a
        signal handler (one os.kill). A kernel is in a session of its own, so a signal to the
        batch does not reach it by itself."""
        pid = getattr(getattr(self._manager, "provisioner", None), "pid", None)
        if pid:
            try:
                os.kill(pid, signal.SIGINT)
            except ProcessLookupError:
                pass

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
            self._manager = manager
        return self._manager


def _reset(manager: _Manager, timeout: float = 120) -> None:
    """Clear the kernel's namespace (RESET) and wait for its reply, on the shell channel only
    (waiting for the output channel to connect costs 0.2 s); an error raises RuntimeError."""
    from jupyter_client import BlockingKernelClient
    client = BlockingKernelClient()
    client.load_connection_info(manager.get_connection_info())
    client.start_channels(iopub=False, stdin=False, hb=False, control=False)
    try:
        msg_id = client.execute(RESET, silent=True, store_history=False)
        reply = client.get_shell_msg(timeout=timeout)
        while reply["parent_header"].get("msg_id") != msg_id:
            reply = client.get_shell_msg(timeout=timeout)
    finally:
        client.stop_channels()
    if reply["content"]["status"] != "ok":
        raise RuntimeError(f"resetting the kernel failed: {reply['content'].get('evalue')}")
