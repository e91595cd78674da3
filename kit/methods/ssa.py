"""Self-Supervised Attention's token labels: the epoch's examples of SSA-Co and SSA-H.

Each epoch from `ssa_start_epoch` on, the model as it stands after the previous epoch probes the
training set (eval mode, no gradients, batched by length):

paper rule (default, Kou et al. 3.1)
    keep the sentences it predicts correctly; draw gamma masked variants per kept sentence
    (fractional gamma: the remainder is a coin flip); each variant masks `mask_ratio` of the real
    word-pieces. A masked token is labelled 1 if the variant's prediction flips, else 0; unmasked
    tokens are unlabelled. The input of the SSA example is the ORIGINAL sentence: the head learns
    which of its tokens matter. How several variants of one sentence reach training is a knob:
    `label_merge="union"` (default): the labels ride on the sentence's own training example (a
    token is 1 if any variant that masked it flipped, 0 if masked only in unflipped ones), so the
    epoch keeps N examples - the paper's "without slowing down the training procedure";
    `"variant"`: every variant is an extra training example (original sentence + that variant's
    labels), so the epoch grows by gamma * kept like BERT-mask's.
code rule (koukoulala/ssa_BERT)
    span masking; a copy qualifies when the original is correct and the copy's prediction does
    NOT change; the input is the masked copy, masked tokens are 0, every other real token 1;
    plain examples get all-ones labels; the share of SSA copies per epoch grows
    0, 0.2, 0.4 ... up to 0.8 and they replace plain examples (the epoch keeps N examples).

All randomness comes from a generator seeded by (seed, epoch) (kit.methods.epochs), so labels
are reproducible. Masking (BERT-mask's, kit.methods.bert_mask) and labelling are vectorised over
padded [variants, tokens] arrays. The head these labels train and SSA-H's hybrid sentence vector
are kit.methods.ssa_heads.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Callable

import numpy as np

from kit.config.paths import input_path
from kit.config.run_config import ConfigError, RunConfig
from kit.data.pipeline import IGNORE, Examples, pad_rows, unpad
from kit.methods.bert_mask import (Masking, budgeted, draw_masks, masked_copies, real_tokens,
                                   variant_counts)
from kit.runs import read_saved_epoch, readable_metrics, write_saved_labels

PredictFn = Callable[[Examples], np.ndarray]   # examples -> class ids or regression values


@dataclass(frozen=True)
class SSASettings:
    """The knobs that shape an epoch's examples, built once per run from its RunConfig (the
    fields keep RunConfig's names and meanings): the functions below take these, not the whole
    config, so a test or a notebook can call them with just these values."""
    method: str
    seed: int
    gamma: float
    masking: Masking
    label_rule: str
    label_merge: str
    ssa_start_epoch: int
    regression_tolerance: float
    code_share_step: float
    code_share_max: float
    budget: str
    save_labels: bool
    reuse_labels_from: str

    @classmethod
    def from_config(cls, cfg: RunConfig) -> "SSASettings":
        """The config's SSA knobs; a relative reuse_labels_from is the project's run folder
        (kit.config.paths.input_path)."""
        masking = Masking(cfg.mask_scheme, cfg.mask_ratio, cfg.aug_threshold, cfg.rm_threshold)
        values = {f.name: getattr(cfg, f.name) for f in fields(cls) if f.name != "masking"}
        if cfg.reuse_labels_from:
            values["reuse_labels_from"] = str(input_path(cfg.reuse_labels_from))
        return cls(masking=masking, **values)


def changed(before: np.ndarray, after: np.ndarray, regression: bool, tol: float) -> np.ndarray:
    if regression:
        return np.abs(after - before) > tol
    return after != before


@dataclass
class LabelStats:
    epoch: int
    rule: str
    probed: int = 0
    kept: int = 0                      # predicted correctly
    variants: int = 0
    flipped: int = 0
    flip_rate: float = 0.0
    labelled_examples: int = 0         # rows with at least one labelled token
    labelled_tokens: int = 0
    share_label1: float = 0.0
    cue_share_label1: float | None = None         # synthetic only: label-1 share on cue tokens
    distractor_share_label1: float | None = None  # ... and on distractor tokens
    label1_precision: float | None = None  # synthetic: share of labelled-1 tokens that are cues
    label1_recall: float | None = None     # ... share of labelled cue tokens labelled 1
    wall_s: float = 0.0
    reused: bool = False

    def finish(self, ssa: Examples, started: float) -> "LabelStats":
        labels = np.concatenate(ssa.ssa_labels) if len(ssa) else np.zeros(0, np.int64)
        labelled = labels != IGNORE
        self.labelled_examples = sum(int((x != IGNORE).any()) for x in ssa.ssa_labels)
        self.labelled_tokens = int(labelled.sum())
        self.share_label1 = float((labels[labelled] == 1).mean()) if labelled.any() else 0.0
        self.flip_rate = self.flipped / self.variants if self.variants else 0.0
        if ssa.importance is not None and len(ssa):
            importance = np.concatenate(ssa.importance)
            for name, want in (("cue_share_label1", 1), ("distractor_share_label1", 0)):
                sel = labelled & (importance == want)
                setattr(self, name, float((labels[sel] == 1).mean()) if sel.any() else None)
            self.label1_precision, self.label1_recall = label_precision_recall(
                labels[labelled], importance[labelled])
        self.wall_s = time.perf_counter() - started
        return self

    def to_dict(self) -> dict:
        return asdict(self)


def label_precision_recall(labels: np.ndarray, importance: np.ndarray
                           ) -> tuple[float | None, float | None]:
    """SSA labels against the true importance mask, over labelled tokens only (unlabelled ones
    carry no claim): precision = cues among the tokens labelled 1, recall = labelled cue tokens
    labelled 1 (= cue_share_label1). None where the denominator is empty."""
    said, true = labels == 1, importance == 1
    precision = float(true[said].mean()) if said.any() else None
    recall = float(said[true].mean()) if true.any() else None
    return precision, recall


def paper_labels(train: Examples, predict: PredictFn, ssa: SSASettings, regression: bool,
                 rng: np.random.Generator, mask_id: int, stats: LabelStats) -> Examples:
    """The epoch's training set by the paper's rule (see the module docstring); the returned
    set's `ssa_labels` hold the generated labels (IGNORE on plain examples)."""
    preds = predict(train)
    kept = np.flatnonzero(~changed(train.labels, preds, regression, ssa.regression_tolerance))
    stats.probed, stats.kept = len(train), len(kept)
    source = np.repeat(kept, variant_counts(len(kept), ssa.gamma, rng))   # variant -> row
    originals = train.subset(source)
    masks = (draw_masks(real_tokens(originals), ssa.masking, rng) if len(source)
             else np.zeros((0, 0), bool))
    flips = changed(preds[source], predict(masked_copies(originals, masks, mask_id)),
                    regression, ssa.regression_tolerance) if len(source) else np.zeros(0, bool)
    stats.variants, stats.flipped = len(source), int(flips.sum())
    labels = np.where(masks, flips[:, None].astype(np.int64), IGNORE)
    if ssa.label_merge == "variant":
        return Examples.concat([train, originals.with_ssa_labels(unpad(labels, originals.lengths))])
    # union: a token is 1 if any variant that masked it flipped, 0 if it was masked only in
    # unflipped ones; the labels ride on the sentence's own example, the epoch keeps N examples
    merged = pad_rows([np.full(len(x), IGNORE, np.int64) for x in train.input_ids], IGNORE)
    np.maximum.at(merged, source, np.pad(labels, ((0, 0), (0, merged.shape[1] - labels.shape[1])),
                                         constant_values=IGNORE))
    return train.with_ssa_labels(unpad(merged, train.lengths))


def code_share(epoch: int, start_epoch: int, step: float, cap: float) -> float:
    """The code rule's share of SSA copies in `epoch`: 0 before `start_epoch`, then step,
    2 * step ... up to `cap`."""
    if epoch < start_epoch:
        return 0.0
    return min(step * (epoch - start_epoch + 1), cap)


def all_ones(examples: Examples) -> Examples:
    return examples.with_ssa_labels([np.where(s, IGNORE, 1).astype(np.int64) for s in examples.special])


CODE_MAX_ROUNDS = 5  # the released code repeats rounds until enough copies qualify; we cap it


def code_labels(train: Examples, predict: PredictFn, ssa: SSASettings, regression: bool,
                rng: np.random.Generator, mask_id: int, epoch: int, stats: LabelStats) -> Examples:
    """The epoch's training set by the released code's rule (see the module docstring)."""
    share = code_share(epoch, ssa.ssa_start_epoch, ssa.code_share_step, ssa.code_share_max)
    target = int(round(share * len(train)))
    preds = predict(train)
    correct = np.flatnonzero(~changed(train.labels, preds, regression, ssa.regression_tolerance))
    stats.probed, stats.kept = len(train), len(correct)
    pending, used, copies_kept = rng.permutation(correct), [], []
    for _ in range(CODE_MAX_ROUNDS):
        missing = target - sum(len(u) for u in used)
        if missing <= 0 or len(pending) == 0:
            break
        originals = train.subset(pending)
        real = real_tokens(originals)
        masks = draw_masks(real, ssa.masking, rng)
        copies = masked_copies(originals, masks, mask_id)
        same = ~changed(preds[pending], predict(copies), regression, ssa.regression_tolerance)
        qualifies = same & masks.any(axis=1)
        stats.variants += len(pending)
        stats.flipped += int((~same).sum())
        labels = np.where(masks, 0, np.where(real, 1, IGNORE))
        good = np.flatnonzero(qualifies)[:missing]
        used.append(pending[good])
        copies_kept.append(copies.subset(good).with_ssa_labels(
            unpad(labels[good], originals.lengths[good])))
        pending = pending[~qualifies]
    used_rows = np.concatenate(used) if used else np.zeros(0, np.int64)
    plain = rng.permutation(np.setdiff1d(np.arange(len(train)), used_rows))
    return Examples.concat([*copies_kept, all_ones(train.subset(plain))])


def missing_labels(source: str, epoch: int) -> str:
    """Why `reuse_labels_from` has no labels for `epoch`: the folder is not there, the run did
    not finish ok (a failed source), or it saved none for that epoch."""
    status = (readable_metrics(Path(source)) or {}).get("status") if Path(source).is_dir() else None
    why = ("no such folder" if not Path(source).is_dir() else
           f"that run's status is {status or 'unknown (no metrics.json)'}" if status != "ok" else
           "that run saved no labels for it (save_labels: true, and as many epochs as this run)")
    return (f"reuse_labels_from: {source} has no saved SSA labels for epoch {epoch} ({why}); "
            "this run would otherwise probe its own labels, another experiment than asked")


def ssa_labels_epoch(train: Examples, ssa: SSASettings, epoch: int, rng: np.random.Generator,
                     predict: PredictFn, regression: bool, mask_id: int,
                     run_dir: Path | None = None) -> tuple[Examples, dict | None]:
    """SSA's epoch (registry `epoch="ssa-labels"`, kit.methods.epochs): from `ssa_start_epoch`
    on, the training set with the labels of the label rule (or those saved by the run named in
    `reuse_labels_from`), capped by the budget; and the epoch's label statistics."""
    if epoch < ssa.ssa_start_epoch:   # nothing probed yet (the code rule trains all-ones labels)
        return (all_ones(train) if ssa.label_rule == "code" else train), None
    started = time.perf_counter()
    # kit.runs reads the saved arrays as data: the source may be a shared folder, and a pickle
    # there (labels of an earlier kit version included) is refused, never loaded
    if ssa.reuse_labels_from:       # the labels of that run, or an error: never a probe
        saved = read_saved_epoch(ssa.reuse_labels_from, epoch)
        if saved is None:
            raise ConfigError(missing_labels(ssa.reuse_labels_from, epoch))
        stats = {**saved["stats"], "reused": True, "wall_s": time.perf_counter() - started}
        return Examples(**saved["epoch_set"]), stats
    stats = LabelStats(epoch=epoch, rule=ssa.label_rule)
    if ssa.label_rule == "paper":
        epoch_set = paper_labels(train, predict, ssa, regression, rng, mask_id, stats)
    else:
        epoch_set = code_labels(train, predict, ssa, regression, rng, mask_id, epoch, stats)
    epoch_set = budgeted(epoch_set, len(train), ssa.budget, rng)
    stats.finish(epoch_set, started)
    if ssa.save_labels and run_dir is not None:
        write_saved_labels(run_dir, epoch, vars(epoch_set), stats.to_dict())
    return epoch_set, stats.to_dict()
