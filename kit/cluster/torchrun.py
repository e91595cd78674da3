"""A data-parallel point under torchrun: its command (the grace a signal leaves its workers,
the signals it passes on to them) and its run, with the batch's signal passed on once."""
from __future__ import annotations

import functools
import signal
import subprocess
import sys

from kit.cluster.signals import FORWARD
from kit.config.paths import PROJECT as REPO
from kit.train.preemption import SIGNALS

# torchrun passes its own four on to its workers, and ours besides: SIGUSR1 (SLURM's warning)
# needs --signals-to-handle, or it would kill torchrun (one without the option gets SIGTERM)
TORCHRUN_OWN = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")
TORCHRUN_SIGNALS = ",".join(dict.fromkeys([*TORCHRUN_OWN, *(s.name for s in SIGNALS)]))


@functools.cache
def torchrun_knows(option: str) -> bool:
    """Whether the installed torchrun takes `option`, asked of its own argument parser (public
    torch.distributed.run.get_args_parser; an option it lacks is left over). Imports torch
    (about a second), once per batch, and only for one that launches torchrun."""
    from torch.distributed.run import get_args_parser
    _, unknown = get_args_parser().parse_known_args([option, "1", "script.py"])
    return not unknown


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
    return name if name in TORCHRUN_OWN or torchrun_knows("--signals-to-handle") else "SIGTERM"


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
