"""The epoch's training examples, by the `epoch` of the run's method in the registry: one builder
per kind (EPOCHS), each in its method's file. A builder takes the plain training set, the run's
SSASettings (kit.methods.ssa), the epoch, the epoch's random generator, `predict` (the model as
it stands after the previous epoch: examples -> class ids or values), whether the task is a
regression, the tokenizer's mask id and the run folder; it returns the epoch's examples and
their statistics for metrics.json (None: nothing to record).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from kit import methods
from kit.data.pipeline import Examples
from kit.methods.bert_mask import masked_copies_epoch
from kit.methods.ssa import PredictFn, SSASettings, ssa_labels_epoch


def plain_epoch(train: Examples, settings: SSASettings, epoch: int, rng: np.random.Generator,
                predict: PredictFn, regression: bool, mask_id: int, run_dir: Path | None = None
                ) -> tuple[Examples, dict | None]:
    """BERT-r's epoch (every `epoch="plain"` method's): the training set as it is."""
    return train, None


EPOCHS = {"plain": plain_epoch, "masked-copies": masked_copies_epoch,
          "ssa-labels": ssa_labels_epoch}


def build_epoch(train: Examples, ssa: SSASettings, epoch: int, predict: PredictFn,
                regression: bool, mask_id: int, run_dir: Path | None = None
                ) -> tuple[Examples, dict | None]:
    """The training examples of one epoch for the run's method (its registry row's `epoch`:
    plain, masked-copies or ssa-labels), and their statistics. The generator is seeded by
    (seed, epoch), so copies and labels are reproducible."""
    rng = np.random.default_rng([ssa.seed, epoch, 0x55A])
    build = EPOCHS[methods.get(ssa.method).epoch]
    return build(train, ssa, epoch, rng, predict, regression, mask_id, run_dir)
