"""THE training step, the loop's (kit.train.loop) and the doctor's speed probe's
(kit.train.speed_probe): forward and loss under the accelerator's autocast, backward (fp16:
scaled), clipping and the optimizer step when the accumulated gradients are complete. Beside
it, what the loop does with the step's losses: the finite check and history.csv's rows."""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch


class NonFiniteLoss(RuntimeError):
    pass


def train_step(accelerator, model, optimizer, loss_terms: Callable[[], dict], max_grad_norm: float,
               on_sync: Callable[[], None] = lambda: None) -> dict[str, torch.Tensor]:
    """One optimizer step (or one accumulation step of it): `loss_terms()` is the model's loss
    and its parts; `on_sync` runs once the gradients are complete, before the update (the loop
    sets the lr there). Returns the loss terms (not detached)."""
    with accelerator.accumulate(model):
        terms = loss_terms()
        accelerator.backward(terms["loss"])
        if accelerator.sync_gradients:
            accelerator.clip_grad_norm_(model.parameters(), max_grad_norm)
            on_sync()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return terms


def history_row(step: int, epoch: float, wall_s: float, names: list[str], window: torch.Tensor,
                window_tasks: list[int], task_names: list[str], epoch_losses: list[list[float]],
                lr: float) -> dict:
    """A history.csv row: the window's mean of each loss term; with several tasks also the
    mean loss of each task in the window (`loss_<TASK>`), kept per task for the epoch record."""
    row = {"step": step, "epoch": epoch, "wall_s": wall_s,
           **dict(zip(names, window.mean(0).tolist()))}
    values = window[:, 0].tolist()
    per_task: dict[str, list[float]] = {}
    for t, value in zip(window_tasks, values):
        epoch_losses[t].append(value)
        per_task.setdefault(f"loss_{task_names[t]}", []).append(value)
    if len(task_names) > 1:
        row.update({k: float(np.mean(v)) for k, v in per_task.items()})
    return {**row, "lr": lr}


def check_finite(window: torch.Tensor, names: list[str], epoch: int, step: int,
                 precision: str = "no") -> None:
    """Stop at the first non-finite loss of the logging window, naming its step and terms. The
    losses are fp32 (computed from the forward's fp32 outputs) under every precision, so a
    non-finite one is a divergence, or under fp16 a forward that left fp16's range; gradients
    that overflow under fp16 are the loss scaler's business (it skips that step), not this."""
    bad = (~torch.isfinite(window)).any(dim=1).nonzero()
    if len(bad):
        row = int(bad[0])
        at = step - len(window) + row
        hint = ("; fp16 autocast: activations may have left fp16's range (65504), bf16 or no "
                "would keep them" if precision == "fp16" else "")
        raise NonFiniteLoss(f"non-finite loss at epoch {epoch} step {at}: " + ", ".join(
            f"{k}={v:.4g}" for k, v in zip(names, window[row].tolist())) + hint)
