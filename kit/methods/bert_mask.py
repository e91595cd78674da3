"""BERT-mask, the paper's augmentation baseline: each epoch from `ssa_start_epoch` on adds gamma
randomly masked copies of every training sentence (`masked_copies_epoch`), capped by the
equal-steps budget (`budgeted`). Its masking is SSA's too (kit.methods.ssa probes with masked
variants): how many variants a sentence gets (gamma), which of its real word-pieces each variant
masks (the paper's ratio or the released code's spans, across both segments of a pair) and the
masked copies themselves. All randomness comes from the caller's generator; masks are vectorised
over padded [rows, tokens].
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kit.data.pipeline import Examples, pad_rows, unpad


def real_tokens(examples: Examples) -> np.ndarray:
    """[N, T] True on word-pieces that may be masked: not special, not padding."""
    return pad_rows([~s for s in examples.special], False)


def ratio_masks(real: np.ndarray, ratio: float, rng: np.random.Generator) -> np.ndarray:
    """Mask round(ratio * n_real) (at least 1) real tokens per row, uniformly without
    replacement, across both segments of a pair."""
    n_real = real.sum(axis=1)
    k = np.where(n_real > 0, np.maximum(1, np.floor(ratio * n_real + 0.5)), 0)
    scores = np.where(real, rng.random(real.shape), 2.0)   # non-real tokens sort last
    ranks = scores.argsort(axis=1).argsort(axis=1)
    return ranks < k[:, None]


def span_lengths(u: np.ndarray, rm_threshold: float) -> np.ndarray:
    """Released code's span lengths: P(3) = 1 - rm_threshold, the rest split 4:3 between
    lengths 1 and 2 (0.4 / 0.3 / 0.3 at the default 0.7)."""
    p1 = rm_threshold * 4 / 7
    return np.where(u < p1, 1, np.where(u < rm_threshold, 2, 3))


def span_masks(real: np.ndarray, aug_threshold: float, rm_threshold: float,
               rng: np.random.Generator) -> np.ndarray:
    """Released code's scheme: each real word-piece starts a span with p = aug_threshold; the span
    (length 1-3) lands at a random position inside the same position-quartile of the sentence.
    Positions are counted over real tokens only, so pairs are masked across both segments."""
    n_rows, width = real.shape
    n = real.sum(axis=1)[:, None]                        # real tokens per row
    idx = np.arange(width)[None, :]                      # index among real tokens
    valid = idx < n
    starts = valid & (rng.random(real.shape) < aug_threshold)
    quartile = (4 * idx) // np.maximum(n, 1)
    lo = -((-quartile * n) // 4)                         # ceil(q * n / 4)
    hi = -((-(quartile + 1) * n) // 4)
    at = lo + np.floor(rng.random(real.shape) * np.maximum(hi - lo, 1)).astype(np.int64)
    length = span_lengths(rng.random(real.shape), rm_threshold)
    compressed = np.zeros(real.shape, dtype=bool)
    rows = np.broadcast_to(np.arange(n_rows)[:, None], real.shape)
    for offset in range(3):                              # spans are at most 3 long
        hit = starts & (offset < length) & (at + offset < n)
        compressed[rows[hit], (at + offset)[hit]] = True
    masks = np.zeros_like(real)
    masks[real] = compressed[valid]                      # row-major order matches
    return masks


@dataclass(frozen=True)
class Masking:
    """How a variant's real word-pieces are masked (RunConfig's mask_scheme, mask_ratio,
    aug_threshold, rm_threshold): `ratio` of them (paper) or the released code's spans."""
    scheme: str
    ratio: float
    aug_threshold: float
    rm_threshold: float


def draw_masks(real: np.ndarray, masking: Masking, rng: np.random.Generator) -> np.ndarray:
    if masking.scheme == "ratio":
        return ratio_masks(real, masking.ratio, rng)
    return span_masks(real, masking.aug_threshold, masking.rm_threshold, rng)


def variant_counts(n: int, gamma: float, rng: np.random.Generator) -> np.ndarray:
    """floor(gamma) variants each, plus one more with probability frac(gamma)."""
    whole = int(np.floor(gamma))
    return whole + (rng.random(n) < gamma - whole).astype(np.int64)


def masked_copies(examples: Examples, masks: np.ndarray, mask_id: int) -> Examples:
    """The same rows with masked positions replaced by the tokenizer's own mask token."""
    ids = pad_rows(examples.input_ids, 0)
    ids = np.where(masks[:, : ids.shape[1]], mask_id, ids)
    return Examples(unpad(ids, examples.lengths), examples.token_type_ids, examples.special,
                    examples.labels, examples.ssa_labels, examples.importance)


def masked_copies_epoch(train: Examples, settings, epoch: int, rng: np.random.Generator,
                        predict, regression: bool, mask_id: int, run_dir=None
                        ) -> tuple[Examples, dict | None]:
    """BERT-mask's epoch (registry `epoch="masked-copies"`, kit.methods.epochs): the training set
    plus gamma masked copies of each sentence (`settings`: the run's kit.methods.ssa.SSASettings,
    its gamma, masking, budget and ssa_start_epoch); the plain set before `ssa_start_epoch`."""
    if epoch < settings.ssa_start_epoch:
        return train, None
    source = np.repeat(np.arange(len(train)), variant_counts(len(train), settings.gamma, rng))
    originals = train.subset(source)
    masks = draw_masks(real_tokens(originals), settings.masking, rng)
    copies = masked_copies(originals, masks, mask_id)
    return (budgeted(Examples.concat([train, copies]), len(train), settings.budget, rng),
            {"epoch": epoch, "augmented": len(copies)})


def budgeted(epoch_set: Examples, n: int, budget: str, rng: np.random.Generator) -> Examples:
    """`budget="equal_steps"`: a seeded subsample of n rows (the plain training set's size) of an
    epoch that grew (BERT-mask's copies, SSA's `variant` merge), so every method takes the
    optimizer steps BERT-r takes and a gain cannot come from more updates. Capping rather than
    training BERT-r longer keeps BERT-r's (and union-merge SSA's) runs as they are."""
    if budget != "equal_steps" or len(epoch_set) <= n:
        return epoch_set
    return epoch_set.subset(np.sort(rng.choice(len(epoch_set), n, replace=False)))
