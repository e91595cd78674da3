"""The masking of a masked-LM pretraining run (method mlm, kit.train.pretrain); the text it reads
is kit.data.pretrain_text's.

Masking: transformers' DataCollatorForLanguageModeling (mlm_probability of the real tokens;
80% [MASK], 10% a random token, 10% kept; optionally whole words), on a batch the loop already
padded, with the torch RNG seeded from the caller's seed: training seeds it from (seed, epoch,
the batch's rows), so a resumed run masks what the uninterrupted one did, whatever else drew
random numbers in between.
"""
from __future__ import annotations

import warnings

import numpy as np
import torch

from kit.models.backbones import ModelError
from kit.data.pipeline import pad_rows
from kit.config.tasks import Split


def word_offsets(tokenizer, split: Split, max_length: int, ids: list[np.ndarray]
                 ) -> list[np.ndarray]:
    """Each row's (start, end) character offsets per token: where whole-word masking finds the
    words (a token that starts where the previous one ended continues its word), for every
    tokenizer kind alike. Tokenized like kit.data.token_cache, and checked against its ids."""
    try:
        enc = tokenizer(split.text_a, split.text_b, truncation=True, max_length=max_length,
                        return_offsets_mapping=True)
    except NotImplementedError:      # a slow (Python) tokenizer has no offsets
        raise ModelError("whole_word_mask needs a fast tokenizer (character offsets); this "
                         "model's tokenizer is a slow one") from None
    out = []
    for row, (got, offsets) in enumerate(zip(enc["input_ids"], enc["offset_mapping"])):
        if got != ids[row].tolist():
            raise RuntimeError(f"{split.source}: tokenization with offsets differs at row {row}")
        out.append(np.asarray(offsets, dtype=np.int64).reshape(-1, 2))
    return out


def seed_of(*parts: int) -> int:
    """One 64-bit seed from non-negative integers (np.random.SeedSequence mixes them)."""
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1, np.uint64)[0])


class Masker:
    """transformers' masking of a padded batch, with the torch RNG seeded per call and the
    process's own RNG left where it was (dropout's stream does not depend on masking)."""

    def __init__(self, tokenizer, probability: float, whole_word: bool):
        from transformers import DataCollatorForLanguageModeling
        if tokenizer.mask_token is None:
            raise ModelError("this model's tokenizer has no mask token; masked-LM pretraining "
                             "needs one")
        options = {"mlm_probability": probability}
        if whole_word:
            if "whole_word_mask" not in DataCollatorForLanguageModeling.__dataclass_fields__:
                raise ModelError("whole_word_mask needs transformers >= 5 (its collator's "
                                 "whole_word_mask option)")
            options["whole_word_mask"] = True
        with warnings.catch_warnings():     # whole words: all [MASK] (transformers' choice)
            warnings.simplefilter("ignore")
            self.collator = DataCollatorForLanguageModeling(tokenizer, **options)
        self.whole_word = whole_word

    def __call__(self, input_ids: torch.Tensor, special: torch.Tensor,
                 offsets: torch.Tensor | None, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(masked input ids, labels: the original id where masked, -100 elsewhere) of a padded
        CPU batch; `special` is True on special tokens and padding, which are never masked."""
        extra = {"offset_mapping": offsets} if self.whole_word else {}
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return self.collator.torch_mask_tokens(input_ids.clone(),
                                                   special_tokens_mask=special.long(), **extra)


def padded_offsets(offsets: list[np.ndarray] | None, rows,
                   length: int | None = None) -> torch.Tensor | None:
    """The rows' token offsets padded like their ids ([rows, length, 2]; padding (0, 0)):
    `length` the ids' padded length (a length bucket's, which may exceed the longest row's:
    whole-word masking broadcasts the two against each other), else the longest row's."""
    if offsets is None:
        return None
    picked = [offsets[i] for i in rows]
    longest = max((len(x) for x in picked), default=0) if length is None else length
    out = np.zeros((len(picked), longest, 2), dtype=np.int64)
    for i, x in enumerate(picked):
        out[i, :len(x)] = x
    return torch.from_numpy(out)


def mask_all(masker: Masker, ids: list[np.ndarray], special: list[np.ndarray],
             offsets: list[np.ndarray] | None, pad_id: int, seed: int, chunk: int = 256
             ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Every row masked once, per row unpadded: (masked ids, labels). For the held-out text:
    masked the same way in every epoch, for any batch size or number of processes (fixed
    chunks of rows, chunk k seeded with (seed, k); chunks bound whole-word masking's
    [rows, length, length] work)."""
    masked, labels = [], []
    for k, start in enumerate(range(0, len(ids), chunk)):
        rows = range(start, min(start + chunk, len(ids)))
        got_ids, got_labels = masker(
            torch.from_numpy(pad_rows([ids[i] for i in rows], pad_id, np.int64)),
            torch.from_numpy(pad_rows([special[i] for i in rows], True, bool)),
            padded_offsets(offsets, rows), seed_of(seed, k))
        masked += [got_ids[j, :len(ids[i])].numpy().copy() for j, i in enumerate(rows)]
        labels += [got_labels[j, :len(ids[i])].numpy().copy() for j, i in enumerate(rows)]
    return masked, labels
