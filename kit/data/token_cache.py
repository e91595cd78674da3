"""Tokenizing a split, and keeping its tokens on disk between runs.

Every point of a grid reads the same splits, and re-tokenizing all of SST-2 costs ~15-30 s, so a
run under `outputs_dir` keeps each tokenized split in `token_cache_dir(outputs_dir)`, keyed by
everything the tokens depend on (token_cache_key). The folder is safe to delete at any time.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load_file, save_file

from kit import io as kio
from kit.config.paths import outputs_root
from kit.config.tasks import Split

Tokens = tuple[list[np.ndarray], list[np.ndarray] | None, list[np.ndarray]]   # ids, types, special

TOKEN_CACHE_FORMAT = 2   # bump when tokenize's call or the stored arrays change


def tokenize(tokenizer, split: Split, max_length: int) -> Tokens:
    """Unpadded int64 ids and token types (None for a tokenizer without them) and the bool
    special-token mask per row; pairs are truncated longest-first like run_glue."""
    enc = tokenizer(split.text_a, split.text_b, truncation=True, max_length=max_length,
                    return_special_tokens_mask=True)
    ids = [np.asarray(x, dtype=np.int64) for x in enc["input_ids"]]
    types = ([np.asarray(x, dtype=np.int64) for x in enc["token_type_ids"]]
             if "token_type_ids" in enc else None)
    special = [np.asarray(x, dtype=bool) for x in enc["special_tokens_mask"]]
    return ids, types, special


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
    for part in (str(TOKEN_CACHE_FORMAT), type(tokenizer).__name__, backend.to_str(),
                 str(max_length), json.dumps([split.text_a, split.text_b])):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


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
    rows' lengths and the concatenated arrays (int32 ids, int8 types)."""
    ids, types, special = tokens
    arrays = {"lengths": np.fromiter(map(len, ids), dtype=np.int64, count=len(ids)),
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
    return ids, types, np.split(z["special"], cuts)
