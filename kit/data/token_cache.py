"""Tokenizing a split, and keeping its tokens on disk between runs.

Every point of a grid reads the same splits, and re-tokenizing all of SST-2 costs ~15-30 s, so a
run under `outputs_dir` keeps each tokenized split in `token_cache_dir(outputs_dir)`, keyed by
everything the tokens depend on (token_cache_key). The folder is safe to delete at any time.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load_file, save_file

from kit import io as kio
from kit.config.paths import outputs_root
from kit.config.tasks import Split

TOKEN_CACHE_FORMAT = 3   # bump when tokenize's call or the stored arrays change


class Tokens(NamedTuple):
    """A tokenized split: unpadded int64 ids and token types (None for a tokenizer without
    them) and the bool special-token mask per row, each at most max_length long; and each row's
    length before max_length cut it (`full_lengths`, what `Truncation` counts)."""
    ids: list[np.ndarray]
    types: list[np.ndarray] | None
    special: list[np.ndarray]
    full_lengths: np.ndarray


@dataclass(frozen=True)
class Truncation:
    """How many of a split's rows max_length cut, and the longest row's full length."""
    rows: int
    truncated: int
    longest: int

    @classmethod
    def of(cls, full_lengths: np.ndarray, max_length: int) -> Truncation:
        return cls(len(full_lengths), int((full_lengths > max_length).sum()),
                   int(full_lengths.max(initial=0)))


def truncation_line(cuts: dict[str, Truncation], max_length: int) -> str | None:
    """`train: 312 of 2834 rows (11.0%), dev: 80 of 709 rows (11.3%) truncated to max_length
    128 (longest 311 tokens)`: the splits (by name) with a truncated row; None when none has one."""
    cut = {name: c for name, c in cuts.items() if c.truncated}
    if not cut:
        return None
    parts = ", ".join(f"{name}: {c.truncated} of {c.rows} rows ({100 * c.truncated / c.rows:.1f}%)"
                      for name, c in cut.items())
    longest = max(c.longest for c in cut.values())
    return f"{parts} truncated to max_length {max_length} (longest {longest} tokens)"


def tokenize(tokenizer, split: Split, max_length: int) -> Tokens:
    """The split's Tokens; pairs are truncated longest-first like run_glue. Every row is
    tokenized whole first (its full length), and only the rows longer than max_length again,
    truncated: a row that fits is the same either way."""
    enc = _encode(tokenizer, split.text_a, split.text_b, None)
    full = np.fromiter(map(len, enc["input_ids"]), dtype=np.int64, count=len(split))
    long = np.flatnonzero(full > max_length).tolist()
    if long:
        pick = lambda xs: None if xs is None else [xs[i] for i in long]  # noqa: E731
        cut = _encode(tokenizer, pick(split.text_a), pick(split.text_b), max_length)
        for key, rows in enc.items():
            for j, i in enumerate(long):
                rows[i] = cut[key][j]
    ids = [np.asarray(x, dtype=np.int64) for x in enc["input_ids"]]
    types = ([np.asarray(x, dtype=np.int64) for x in enc["token_type_ids"]]
             if "token_type_ids" in enc else None)
    special = [np.asarray(x, dtype=bool) for x in enc["special_tokens_mask"]]
    return Tokens(ids, types, special, full)


def _encode(tokenizer, text_a: list[str], text_b: list[str] | None, max_length: int | None
            ) -> dict[str, list]:
    """The tokenizer's rows (truncated to max_length; None: whole, without transformers'
    too-long-for-the-model warning: the run's own line counts them)."""
    enc = tokenizer(text_a, text_b, truncation=max_length is not None, max_length=max_length,
                    return_special_tokens_mask=True, verbose=False)
    return {key: list(rows) for key, rows in enc.items()}


def token_cache_dir(outputs_dir: str | Path) -> Path:
    """Where runs under `outputs_dir` keep tokenized splits (safe to delete at any time); the
    outputs folder by kit.config.paths.outputs_root."""
    return outputs_root(outputs_dir) / "cache" / "tokens"


def token_cache_key(tokenizer, split: Split, max_length: int) -> str | None:
    """What the tokens of a split depend on, hashed: the tokenizer's full definition (its
    vocabulary, normalizer, pre-tokenizer and special-token template, as the fast tokenizer
    serializes them), the max length, and the texts themselves (so a changed file, a different
    row subset or another task never hits a stale entry). None for a tokenizer without a
    serializable fast backend: those are not cached."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    h = hashlib.sha256()
    for part in (str(TOKEN_CACHE_FORMAT), type(tokenizer).__name__, _definition(backend),
                 str(max_length), json.dumps([split.text_a, split.text_b])):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


def _definition(backend) -> str:
    """The fast tokenizer's serialization without its truncation and padding: those are what
    its last call left set (each call sets its own; `tokenize` makes two kinds), not what the
    tokens depend on. They are set back as they were."""
    truncation, padding = backend.truncation, backend.padding
    backend.no_truncation()
    backend.no_padding()
    try:
        return backend.to_str()
    finally:
        if truncation:
            backend.enable_truncation(**truncation)
        if padding:
            backend.enable_padding(**padding)


def tokenize_cached(tokenizer, split: Split, max_length: int, cache_dir: Path) -> Tokens:
    """Read the split's tokens from `cache_dir`, else tokenize and store them (atomically: a
    concurrent run reads either nothing or a whole file). An unreadable entry is rewritten."""
    key = token_cache_key(tokenizer, split, max_length)
    if key is None:
        return tokenize(tokenizer, split, max_length)
    path = cache_dir / f"{key}.safetensors"
    if path.exists():
        try:
            return load_tokens(path)
        except (OSError, ValueError, KeyError, SafetensorError):
            pass
    tokens = tokenize(tokenizer, split, max_length)
    try:
        store_tokens(path, tokens)
    except OSError:            # a read-only outputs folder: the run goes on uncached
        pass
    return tokens


def store_tokens(path: Path, tokens: Tokens) -> None:
    """One safetensors file per split (data only, never a pickle: outputs/ may be shared): the
    rows' lengths, their full lengths and the concatenated arrays (int32 ids, int8 types)."""
    ids, types, special, full = tokens
    arrays = {"lengths": np.fromiter(map(len, ids), dtype=np.int64, count=len(ids)),
              "full_lengths": full.astype(np.int64),
              "ids": np.concatenate(ids).astype(np.int32) if ids else np.zeros(0, np.int32),
              "special": np.concatenate(special) if special else np.zeros(0, bool)}
    if types is not None:
        arrays["types"] = np.concatenate(types).astype(np.int8) if types else np.zeros(0, np.int8)
    path.parent.mkdir(parents=True, exist_ok=True)
    with kio.atomic_path(path) as tmp:
        save_file(arrays, str(tmp))


def load_tokens(path: Path) -> Tokens:
    z = load_file(str(path))
    cuts = np.cumsum(z["lengths"])[:-1]
    ids = np.split(z["ids"].astype(np.int64), cuts)
    types = np.split(z["types"].astype(np.int64), cuts) if "types" in z else None
    return Tokens(ids, types, np.split(z["special"], cuts), z["full_lengths"])
