"""What a kind of run brings to THE loop (kit.train.loop): the `Job` it subclasses
(kit.train.finetune.SingleTask, kit.train.multitask.MultiTask, kit.train.pretrain.Pretrain) and
the `Epoch` of training work a job draws."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from kit.config.tasks import TaskData
from kit.data.pipeline import Examples, encode_counted
from kit.data.token_cache import Truncation, truncation_line
from kit.models.model_io import save_model
from kit.train import run_state
from kit.train.accel import process_state
from kit.train.progress import note


@dataclass
class Epoch(run_state.EpochWork):
    """One epoch's training work: the examples of each task and the plan of global batches
    (task index, rows of that task's examples), plus SSA label statistics if any."""
    sets: list[Examples]
    plan: list[tuple[int, list[int]]]
    label_stats: dict | None = None


class Job:
    """What a kind of run brings to the loop (see kit.train.finetune.SingleTask,
    kit.train.multitask.MultiTask).

    Attributes set by the constructor: model (not yet prepared), tokenizer, tasks (kit Task
    list), pad_id, has_test; the loop adds `writer` (True in the process that writes files),
    `trainable` (ids of the parameters that train) and `stop` (the signals noted: a pass of the
    job's own asks `stop.between_batches`). Methods below."""
    # DDP: True when a step may leave parameters without a gradient (multi-task heads, stages)
    find_unused_parameters = False
    # the batch tensors its steps read (kit.data.tensors.collate's names), the only ones copied
    # to the device; None: every one
    inputs: tuple[str, ...] | None = None
    # length_buckets may pad its batches with rows of weight 0 (its losses weigh them)
    pads_rows = True
    # the run's optimizer steps, as far as known before training (cuda_graphs: auto weighs its
    # compilation against them); 0: unknown, and auto leaves graphs off
    planned_steps = 0

    def resumed(self, epoch: int) -> None:
        """Fast-forward any state that carries across epochs to where it was once the batches of
        epochs 0 .. `epoch` were drawn (a resumed run; -1: none)."""

    def begin(self, epoch: int, unwrapped) -> None:
        """Set what this epoch's steps rely on (gated stages, masking seeds): before its first
        step, and again when a run resumes inside it."""

    def epoch(self, epoch: int, probe: Callable[[Examples], np.ndarray], unwrapped) -> Epoch:
        raise NotImplementedError

    def on_host(self, batch: dict, task: int) -> dict:
        """The step's batch as collated (host tensors), before it goes to the device: where a
        job draws per-batch inputs (pretraining's masks) without reading the device back."""
        return batch

    def loss_terms(self, model, batch: dict, task: int) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def evaluate(self, predict, unwrapped) -> tuple[dict, dict, dict]:
        """(dev metrics with "score", three-subset stats, {task name: {split: (preds, labels)}})."""
        raise NotImplementedError

    def record(self, epoch: int, work: Epoch, history: list, epoch_losses: list) -> dict:
        """Extra fields of the epoch's record (train_loss ...)."""
        raise NotImplementedError

    def write_dev(self, run_dir: Path, results: dict, suffix: str = "") -> None:
        raise NotImplementedError

    def write_test(self, run_dir: Path, predict, unwrapped) -> None:
        """Predict the test splits (every rank: prediction is collective); write if `writer`."""
        raise NotImplementedError

    def save(self, model, tokenizer, folder: Path) -> None:
        save_model(model, tokenizer, folder)

    def load(self, folder: Path):
        raise NotImplementedError

    def summary(self, progress: run_state.Progress, unwrapped) -> dict:
        """best_dev, best_three_subset, last_dev and the job's own result fields."""
        raise NotImplementedError


def encode_task(tokenizer, data: TaskData, max_length: int, cache_dir: Path
                ) -> tuple[Examples, dict[str, Examples], dict[str, Truncation]]:
    """A task's train and dev splits tokenized (kit.data.pipeline.encode; `cache_dir`: a grid's
    points tokenize each split once), and how many rows of each max_length cut, by split name."""
    encoded = {name: encode_counted(tokenizer, split, max_length, data.task.regression, cache_dir)
               for name, split in {"train": data.train, **data.dev}.items()}
    cuts = {name: cut for name, (_, cut) in encoded.items()}
    train = encoded.pop("train")[0]
    return train, {name: examples for name, (examples, _) in encoded.items()}, cuts


def note_truncation(cuts: dict[str, Truncation], max_length: int) -> dict[str, dict]:
    """One warning line (kit.train.progress.note, from the main process) when max_length cut
    rows of the run's splits, named as in `cuts` (kit.data.token_cache.truncation_line): a
    CommonLit excerpt (~250 word-pieces) loses half its text at 128. Returns the counts as
    metrics.json keeps them (`truncation`)."""
    line = truncation_line(cuts, max_length)
    if line and process_state().is_main_process:
        note(f"warning: {line}")
    return {name: asdict(cut) for name, cut in cuts.items()}
