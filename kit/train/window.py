"""The logging window: the loss terms of the steps since the last history.csv row, kept on the
device where the steps computed them. A step appends without reading anything back (on a GPU a
read waits for every queued kernel, so one per step would serialise the host and the device);
the window is read once per row, and only then checked for non-finite values, naming the step
that went non-finite all the same."""
from __future__ import annotations

import math

import numpy as np
import torch


class NonFiniteLoss(RuntimeError):
    pass


class LossWindow:
    """Each step's loss terms (one device tensor a step, stacked) and the task of its batch."""

    def __init__(self, device: torch.device):
        self.device = device
        self.rows: list[torch.Tensor] = []
        self.tasks: list[int] = []

    def add(self, terms: dict[str, torch.Tensor], task: int) -> None:
        self.rows.append(torch.stack([v.detach() for v in terms.values()]))
        self.tasks.append(task)

    def restore(self, rows: list[list[float]], tasks: list[int]) -> None:
        """A mid-epoch checkpoint's window. On the run's device, as the steps' own rows are:
        stacked with them at the next read, a host tensor among device ones would fail."""
        self.rows = [torch.tensor(row, dtype=torch.float32, device=self.device) for row in rows]
        self.tasks = list(tasks)

    def saved(self) -> tuple[list[list[float]], list[int]]:
        """(rows, tasks) as a checkpoint keeps them (JSON): a read, at a checkpoint only."""
        return [row.float().tolist() for row in self.rows], list(self.tasks)

    def read(self, accelerator) -> tuple[list[float], list[list[float]], list[int]]:
        """(each term's mean, each step's terms, each step's task), averaged over the processes;
        the window is emptied. The means are taken on the device, as before, and come back with
        the rows in ONE copy: the window's only read."""
        window = torch.stack(self.rows).float()
        if accelerator.num_processes > 1:
            window = accelerator.reduce(window, "mean")
        steps, terms = window.shape
        values = torch.cat([window.mean(0), window.flatten()]).tolist()
        rows = [values[terms + i * terms:terms + (i + 1) * terms] for i in range(steps)]
        tasks, self.rows, self.tasks = self.tasks, [], []
        return values[:terms], rows, tasks


def check_finite(window, names: list[str], epoch: int, step: int, precision: str = "no") -> None:
    """Stop at the first non-finite loss of the logging window (rows of host floats, or a
    tensor), naming its step and terms. The losses are fp32 (computed from the forward's fp32
    outputs) under every precision, so a non-finite one is a divergence, or under fp16 a forward
    that left fp16's range; gradients that overflow under fp16 are the loss scaler's business
    (it skips that step), not this."""
    rows = window.tolist() if isinstance(window, torch.Tensor) else window
    for row, values in enumerate(rows):
        if all(math.isfinite(v) for v in values):
            continue
        at = step - len(rows) + row + 1       # `step` counts from 1, as history.csv does
        hint = ("; fp16 autocast: activations may have left fp16's range (65504), bf16 or no "
                "would keep them" if precision == "fp16" else "")
        raise NonFiniteLoss(f"non-finite loss at epoch {epoch} step {at}: " + ", ".join(
            f"{k}={v:.4g}" for k, v in zip(names, values)) + hint)


def refuse_non_finite(accelerator, model, rows: list[list[float]], names: list[str], epoch: int,
                      step: int, precision: str = "no") -> None:
    """Before any checkpoint: the window's values (already on the host for the checkpoint) and
    the weights about to be saved must be finite, else NonFiniteLoss, and `last` / `best` keep
    the previous, finite state, which a rerun resumes from. The weights' check is one device
    read, at a checkpoint only (saving them reads them all anyway): a step whose loss was finite
    can still write non-finite weights. Every process raises alike (the flags are summed)."""
    try:
        check_finite(rows, names, epoch, step, precision)
        why = ""
    except NonFiniteLoss as err:
        why = str(err)
    weights = torch.stack([p.detach().isfinite().all() for p in model.parameters()]).all()
    bad = torch.stack([~weights, torch.tensor(bool(why), device=weights.device)]).float()
    if accelerator.num_processes > 1:
        bad = accelerator.reduce(bad, "sum")
    bad_weights, bad_loss = bad.tolist()
    if not (bad_weights or bad_loss):
        return
    why = why or (f"non-finite loss on another process by epoch {epoch} step {step}" if bad_loss
                  else f"non-finite weights after epoch {epoch} step {step}")
    raise NonFiniteLoss(f"{why}; checkpoint/last keeps the last finite state")


def history_row(step: int, epoch: float, wall_s: float, names: list[str], means: list[float],
                rows: list[list[float]], window_tasks: list[int], task_names: list[str],
                epoch_losses: list[list[float]], lr: float) -> dict:
    """A history.csv row: the window's mean of each loss term; with several tasks also the
    mean loss of each task in the window (`loss_<TASK>`), kept per task for the epoch record."""
    row = {"step": step, "epoch": epoch, "wall_s": wall_s, **dict(zip(names, means))}
    per_task: dict[str, list[float]] = {}
    for t, values in zip(window_tasks, rows):
        epoch_losses[t].append(values[0])
        per_task.setdefault(f"loss_{task_names[t]}", []).append(values[0])
    if len(task_names) > 1:
        row.update({k: float(np.mean(v)) for k, v in per_task.items()})
    return {**row, "lr": lr}
