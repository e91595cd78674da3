"""THE training step, the loop's (kit.train.loop) and the doctor's speed probe's
(kit.train.speed_probe): forward and loss under the accelerator's autocast, backward (fp16:
scaled), clipping and the optimizer step when the accumulated gradients are complete. Beside
it, a batch's way to the device (only the tensors the job reads; the static shapes of
`length_buckets`) and THE inference pass (`predict_logits`: SSA probing, evaluation, test
prediction). Nothing in a step or a batch of the pass reads a device value back: on a GPU each
read waits for every kernel queued before it (the losses are read per logging window:
kit.train.window; the logits once at the end of a pass)."""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from kit.data.pipeline import Examples, StaticShape, sorted_batches
from kit.data.tensors import collate
from kit.train import progress as kprogress


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


# ---------------------------------------------------------------- batches on the device

# what a forward reads of a batch (the inference pass copies no more)
FORWARD = ("input_ids", "attention_mask", "special_mask", "token_type_ids")


def static_shape(choice: str, max_length: int, rows: int) -> StaticShape | None:
    """RunConfig.length_buckets: `on` pads every batch to a length bucket and `rows` rows
    (kit.data.pipeline.StaticShape); `auto` is `off` on every device: the CPU measured batches
    of their own longest row faster (no first-use cost to save there), and a GPU has not yet
    measured the difference (docs/gpu.md; auto will take the device once one has)."""
    return StaticShape(max_length, rows) if choice == "on" else None


def shard(rows: list[int], accelerator) -> list[int]:
    """This rank's part of a global batch: rows[rank::n]. A batch smaller than the number of
    processes is cycled so every rank has a row (its repeats weigh the same as the originals)."""
    return shard_of(rows, accelerator.process_index, accelerator.num_processes)


def shard_of(rows: list[int], rank: int, n: int) -> list[int]:
    if n == 1:
        return rows
    if len(rows) < n:
        rows = [rows[i % len(rows)] for i in range(n)]
    return rows[rank::n]


def to_device(batch: dict, device, keys=None) -> dict:
    """The batch's tensors named in `keys` (None: all) on the run's device. CUDA: from pinned
    memory, so the copy overlaps the compute; MPS (unified memory, no pinning): a plain copy;
    CPU: the tensors as they are."""
    batch = {k: v for k, v in batch.items() if keys is None or k in keys}
    if device.type == "cuda":
        return {k: v.pin_memory().to(device, non_blocking=True) for k, v in batch.items()}
    if device.type == "cpu":
        return batch
    return {k: v.to(device) for k, v in batch.items()}


# ---------------------------------------------------------------- the inference pass

@torch.inference_mode()
def predict_logits(model, examples: Examples, batch_size: int, pad_id: int, accelerator=None,
                   desc: str = "eval", stop=None, shape: StaticShape | None = None,
                   keys=FORWARD) -> np.ndarray:
    """Logits for every row, in row order. Eval mode (no dropout); longest batches first; with
    several processes each rank runs its slice of every batch and the slices are gathered.
    The logits stay on the device until the pass ends, then come back in one copy; which row
    each is comes from the host's own batches (`gathered_rows`), never from the device.
    `shape`: the static shapes of training (its rows: this pass's batch, per process). `stop`
    (kit.train.preemption.Stop): a signal ends the pass between two batches with
    preemption.Interrupted, so a stop waits for one batch, not for the whole dev set.
    `accelerator` None (kit.predict): one process on the model's device, no progress bar."""
    was_training = model.training
    model.eval()
    n, rank = (accelerator.num_processes, accelerator.process_index) if accelerator else (1, 0)
    device = accelerator.device if accelerator else next(model.parameters()).device
    per_rank = -(-batch_size // n)
    if shape is not None:
        shape = StaticShape(shape.max_length, per_rank, shape.step)
    order, logits = [], []
    bar = kprogress.bar(sorted_batches(examples.lengths, batch_size), desc=desc,
                        disable=not (accelerator and accelerator.is_local_main_process))
    try:
        for idx in bar:
            if stop is not None:
                stop.between_batches(accelerator)
            batch = to_device(collate(examples, shard_of(idx, rank, n), pad_id, shape), device,
                              keys)
            out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                        special_mask=batch.get("special_mask"),
                        token_type_ids=batch.get("token_type_ids"))
            got = out["logits"].float()
            if n > 1:    # every slice padded to one size (known here), gathered in rank order
                width = max(len(got), -(-max(len(idx), n) // n))
                got = accelerator.gather(F.pad(got, (0, 0, 0, width - len(got))))
            order.append(gathered_rows(idx, n, len(got) // n))
            logits.append(got)
    finally:
        bar.close()
        model.train(was_training)
    rows = np.concatenate(order)
    values = torch.cat(logits).cpu().numpy()          # the pass's one read
    result = np.empty((len(examples), values.shape[-1]), dtype=np.float32)
    result[rows[rows >= 0]] = values[rows >= 0]
    return result


def gathered_rows(idx: list[int], n: int, width: int) -> np.ndarray:
    """The row of each gathered logit of a batch: the ranks' slices in rank order, each `width`
    long, -1 where a slice was padded (a static shape's rows, or one shorter than the others)."""
    slices = [shard_of(idx, rank, n) for rank in range(n)]
    return np.concatenate([np.pad(np.asarray(s, dtype=np.int64), (0, width - len(s)),
                                  constant_values=-1) for s in slices])


def to_predictions(logits: np.ndarray, regression: bool) -> np.ndarray:
    """A pass's predictions: the score of a regression, else the class of highest logit."""
    return logits[:, 0] if regression else logits.argmax(-1)
