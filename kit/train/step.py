"""THE training step, the loop's (kit.train.loop) and the doctor's speed probe's
(kit.train.speed_probe): forward and loss under the accelerator's autocast, backward (fp16:
scaled), clipping and the optimizer step when the accumulated gradients are complete. Beside
it, what the loop does with the step's losses (the finite check and history.csv's rows) and
THE inference pass (`predict_logits`: SSA probing, evaluation, test prediction)."""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from kit.data.pipeline import Examples, sorted_batches
from kit.data.tensors import collate
from kit.train import progress as kprogress


class NonFiniteLoss(RuntimeError):
    pass


def train_step(accelerator, model, optimizer, loss_terms: Callable[[], dict], max_grad_norm: float,
               on_sync: Callable[[], None] = lambda: None, group: int = 0,
               close: bool = False) -> dict[str, torch.Tensor]:
    """One optimizer step (or one accumulation step of it): `loss_terms()` is the model's loss
    and its parts; `on_sync` runs once the gradients are complete, before the update (the loop
    sets the lr there). Returns the loss terms (not detached).

    Gradient accumulation (accelerate counts the batches in `accelerator.step` and divides each
    loss by `grad_accum`): `group` is the number of batches of the accumulation this one belongs
    to when that is fewer (the epoch's last), and `close` ends the accumulation with this batch
    whatever the count says. Each loss of a short group is weighted grad_accum / group, so its
    update is the mean of its batches' gradients, as a full group's is."""
    n = accelerator.gradient_accumulation_steps
    if close:          # accumulate() adds one to the count, then syncs where it divides by n
        accelerator.step = n - 1
    with accelerator.accumulate(model):
        terms = loss_terms()
        loss = terms["loss"] if not group or group == n else terms["loss"] * (n / group)
        accelerator.backward(loss)
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


# ---------------------------------------------------------------- the inference pass

def shard(rows: list[int], accelerator) -> list[int]:
    """This rank's part of a global batch: rows[rank::n]. A batch smaller than the number of
    processes is cycled so every rank has a row (its repeats weigh the same as the originals)."""
    n = accelerator.num_processes
    if n == 1:
        return rows
    if len(rows) < n:
        rows = [rows[i % len(rows)] for i in range(n)]
    return rows[accelerator.process_index::n]


def to_device(batch: dict, device) -> dict:
    """The batch on the run's device. CUDA: from pinned memory, so the copy overlaps the compute;
    MPS (unified memory, no pinning) and CPU: a plain copy (none on the CPU)."""
    if device.type == "cuda":
        return {k: v.pin_memory().to(device, non_blocking=True) for k, v in batch.items()}
    return {k: v.to(device) for k, v in batch.items()}


@torch.inference_mode()
def predict_logits(model, examples: Examples, batch_size: int, pad_id: int, accelerator,
                   desc: str = "eval", stop=None) -> np.ndarray:
    """Logits for every row, in row order. Eval mode (no dropout); longest batches first; with
    several processes each rank runs its slice of every batch and the slices are gathered.
    `stop` (kit.train.preemption.Stop): a signal ends the pass between two batches with
    preemption.Interrupted, so a stop waits for one batch, not for the whole dev set."""
    was_training = model.training
    model.eval()
    n = accelerator.num_processes
    rows, logits = [], []
    bar = kprogress.bar(sorted_batches(examples.lengths, batch_size), desc=desc,
                        disable=not accelerator.is_local_main_process)
    try:
        for idx in bar:
            if stop is not None:
                stop.between_batches(accelerator)
            batch = to_device(collate(examples, shard(idx, accelerator), pad_id),
                              accelerator.device)
            out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                        special_mask=batch["special_mask"],
                        token_type_ids=batch.get("token_type_ids"))
            got_rows, got = batch["rows"], out["logits"].float()
            if n > 1:    # slices differ in size by one: pad (row -1), gather, drop the padding
                got_rows = accelerator.gather(accelerator.pad_across_processes(got_rows,
                                                                               pad_index=-1))
                got = accelerator.gather(accelerator.pad_across_processes(got))
                got, got_rows = got[got_rows >= 0], got_rows[got_rows >= 0]
            rows.append(got_rows.cpu())
            logits.append(got.cpu())
    finally:
        bar.close()
        model.train(was_training)
    result = np.empty((len(examples), logits[0].shape[-1]), dtype=np.float32)
    result[torch.cat(rows).numpy()] = torch.cat(logits).numpy()
    return result
