"""From a config to tokenized examples and batches.

Texts are tokenized once per run into unpadded id arrays (`Examples`); every batch is padded only
to its own longest row. Training batches are length-grouped (shuffled mega-batches sorted by
length), so almost every token in a batch is a real one; evaluation batches are fully sorted.
"""
from __future__ import annotations

import hashlib
import json
import os
import zipfile
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from kit import io as kio
from kit import readers, synthetic
from kit.config import RunConfig
from kit.tasks import Split, Task, csv_task, get_task

IGNORE = -100  # label of positions that no loss looks at


@dataclass
class TaskData:
    task: Task
    train: Split
    dev: dict[str, Split]              # dev split name -> split (MNLI has two)
    test: dict[str, Split]


# The project's own copy of the real GLUE files (data/glue/SOURCES.md): a fresh clone runs offline.
PROJECT_GLUE = Path(__file__).resolve().parents[1] / "data" / "glue"


def glue_source(glue_dir: str, task: str = "") -> str | Path:
    """Where a GLUE task's files are read from, first match wins: the `glue_dir` parameter >
    $GLUE_DIR > the project's data/glue when it holds `task` > the hub ("hub"). A folder that
    is named but does not exist is an error, never a silent fall-through to the next source."""
    if glue_dir == "hub":
        return "hub"
    for origin, chosen in (("glue_dir", glue_dir), ("GLUE_DIR", os.environ.get("GLUE_DIR", ""))):
        if chosen:
            path = Path(chosen).expanduser()
            if not path.is_dir():
                raise readers.DataError(f"{origin}={chosen}: no such folder; point it at the "
                                        "folder holding the <TASK>/ subfolders, or unset it to "
                                        f"use the project's copy ({PROJECT_GLUE})")
            return path
    if task and (PROJECT_GLUE / task).is_dir():
        return PROJECT_GLUE
    return "hub"


def load_task_data(cfg: RunConfig) -> TaskData:
    if cfg.task.lower() == "csv":
        return _load_csv(cfg)
    task = get_task(cfg.task)
    if task.kind == "synthetic":
        pair = task.is_pair
        hard = dict(spurious=cfg.synthetic_spurious, distractors=cfg.synthetic_distractors)
        train = synthetic.generate(pair, cfg.synthetic_size, "train", **hard)
        dev = synthetic.generate(pair, max(cfg.synthetic_size // 4, 8), "dev", **hard)
        return TaskData(task, _cap(train, cfg), {"dev": dev}, {})
    source = glue_source(cfg.glue_dir, task.name)

    def read(split: str) -> Split:
        if source == "hub":
            return readers.read_hub_split(task, split)
        return readers.read_glue_split(task, split, source)

    train = read("train")
    dev = {name: read(name) for name in task.dev_splits}
    test = {name: read(name) for name in task.test_splits} if cfg.predict_test else {}
    return TaskData(task, _cap(train, cfg), dev, test)


def _load_csv(cfg: RunConfig) -> TaskData:
    """A user's CSV as train + dev. Without folds (n_folds 0): a seeded 80/20 split (seed = the
    run's seed). With n_folds k: dev is the rows of fold `cfg.fold`, train every other row. Fold
    ids come from `csv_fold_column` when given (its sorted distinct values become 0..), else
    kit.folds assigns them with a FIXED seed 0, stratified on the classes (classification) or
    on quantile bins of the target (regression): folds are a property of the data, so every
    seed of a grid validates on the same rows and one seed's k runs give out-of-fold
    predictions for every row. `max_train_examples` caps train as for GLUE tasks. A
    `csv_test_path` file is the test split (its ids from `csv_id_column`): submission.csv."""
    from kit.folds import assign_folds
    split, labels = readers.read_csv_split(cfg.csv_path, cfg.csv_text_columns, cfg.csv_target,
                                           cfg.csv_regression, cfg.csv_fold_column or None)
    try:
        task = csv_task(cfg.csv_text_columns, None if cfg.csv_regression else labels,
                        cfg.csv_metric)
    except ValueError as err:                # csv_metric f1 on more than two classes
        raise readers.DataError(f"{cfg.csv_path}: {err}") from None
    test = ({"test": readers.read_csv_test(cfg.csv_test_path, cfg.csv_text_columns,
                                           cfg.csv_id_column)} if cfg.csv_test_path else {})
    if not cfg.n_folds:
        order = np.random.default_rng(cfg.seed).permutation(len(split))
        n_dev = max(len(split) // 5, 1)    # without folds: a seeded 80/20 split
        return TaskData(task, _cap(split.subset(order[n_dev:]), cfg),
                        {"dev": split.subset(order[:n_dev])}, test)
    try:
        folds = assign_folds(cfg.n_folds, seed=0, labels=split.labels,
                             regression=cfg.csv_regression, given=split.folds)
    except ValueError as err:          # too few rows or fold values: say which file
        raise readers.DataError(f"{cfg.csv_path}: cannot make {cfg.n_folds} folds ({err})") from None
    split.folds = folds
    dev = np.flatnonzero(folds == cfg.fold)
    if not len(dev) or len(dev) == len(split):
        raise readers.DataError(f"{cfg.csv_path}: fold {cfg.fold} holds {len(dev)} of "
                                f"{len(split)} rows; dev and train must both be non-empty")
    train = np.flatnonzero(folds != cfg.fold)
    return TaskData(task, _cap(split.subset(train), cfg), {"dev": split.subset(dev)}, test)


def _cap(train: Split, cfg: RunConfig) -> Split:
    """The first `max_train_examples` of a fixed shuffle (fixed: the same subset for every seed)."""
    if not cfg.max_train_examples or cfg.max_train_examples >= len(train):
        return train
    order = np.random.default_rng(0).permutation(len(train))[: cfg.max_train_examples]
    return train.subset(np.sort(order))


@dataclass
class Examples:
    """Tokenized rows. Per-row arrays are unpadded; `special` marks [CLS]/[SEP]/<s>/</s>."""
    input_ids: list[np.ndarray]
    token_type_ids: list[np.ndarray] | None
    special: list[np.ndarray]
    labels: np.ndarray
    ssa_labels: list[np.ndarray] | None = None      # per token: 1, 0 or IGNORE
    importance: list[np.ndarray] | None = None      # synthetic: true importance per token

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def lengths(self) -> np.ndarray:
        return np.fromiter((len(x) for x in self.input_ids), dtype=np.int64, count=len(self))

    def subset(self, idx) -> "Examples":
        pick = lambda xs: None if xs is None else [xs[i] for i in idx]  # noqa: E731
        return Examples(pick(self.input_ids), pick(self.token_type_ids), pick(self.special),
                        self.labels[np.asarray(idx, dtype=np.int64)], pick(self.ssa_labels),
                        pick(self.importance))

    def with_ssa_labels(self, ssa_labels: list[np.ndarray]) -> "Examples":
        return replace(self, ssa_labels=ssa_labels)

    @staticmethod
    def concat(parts: list["Examples"]) -> "Examples":
        """Join example sets; a set without SSA labels gets all-IGNORE labels."""
        def join(attr):
            if all(getattr(p, attr) is None for p in parts):
                return None
            out = []
            for p in parts:
                got = getattr(p, attr)
                out += got if got is not None else [np.full(len(x), IGNORE, np.int64)
                                                    for x in p.input_ids]
            return out
        return Examples(
            [x for p in parts for x in p.input_ids],
            None if parts[0].token_type_ids is None else [x for p in parts for x in p.token_type_ids],
            [x for p in parts for x in p.special], np.concatenate([p.labels for p in parts]),
            join("ssa_labels"), join("importance"))


def encode(tokenizer, split: Split, max_length: int, regression: bool,
           cache_dir: str | Path | None = None) -> Examples:
    """Tokenize a split once (no padding); pairs are truncated longest-first like run_glue.
    With `cache_dir` (see token_cache_dir), the token arrays are kept there for the next run:
    every point of a grid reads the same split, and re-tokenizing all of SST-2 costs ~15-30 s."""
    tokens = _tokenize_cached(tokenizer, split, max_length, Path(cache_dir)) if cache_dir \
        else _tokenize(tokenizer, split, max_length)
    ids, types, special = tokens
    if split.labels is None:
        labels = np.zeros(len(ids), dtype=np.float32 if regression else np.int64)
    else:
        labels = split.labels.astype(np.float32 if regression else np.int64)
    importance = None
    if split.importance is not None:
        importance = _token_importance(tokenizer, split, max_length, ids)
    return Examples(ids, types, special, labels, importance=importance)


Tokens = tuple[list[np.ndarray], list[np.ndarray] | None, list[np.ndarray]]   # ids, types, special


def _tokenize(tokenizer, split: Split, max_length: int) -> Tokens:
    enc = tokenizer(split.text_a, split.text_b, truncation=True, max_length=max_length,
                    return_special_tokens_mask=True)
    ids = [np.asarray(x, dtype=np.int64) for x in enc["input_ids"]]
    types = ([np.asarray(x, dtype=np.int64) for x in enc["token_type_ids"]]
             if "token_type_ids" in enc else None)
    special = [np.asarray(x, dtype=bool) for x in enc["special_tokens_mask"]]
    return ids, types, special


TOKEN_CACHE_FORMAT = 1   # bump when _tokenize's call or the stored arrays change


def token_cache_dir(outputs_dir: str | Path) -> Path:
    """Where runs under `outputs_dir` keep tokenized splits (safe to delete at any time)."""
    return Path(outputs_dir) / "cache" / "tokens"


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


def _tokenize_cached(tokenizer, split: Split, max_length: int, cache_dir: Path) -> Tokens:
    """Read the split's tokens from `cache_dir`, else tokenize and store them (atomically: a
    concurrent run reads either nothing or a whole file). An unreadable entry is rewritten."""
    key = token_cache_key(tokenizer, split, max_length)
    if key is None:
        return _tokenize(tokenizer, split, max_length)
    path = cache_dir / f"{key}.npz"
    if path.exists():
        try:
            return _load_tokens(path)
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
            pass
    tokens = _tokenize(tokenizer, split, max_length)
    try:
        _store_tokens(path, tokens)
    except OSError:            # a read-only outputs folder: the run goes on uncached
        pass
    return tokens


def _store_tokens(path: Path, tokens: Tokens) -> None:
    """One file per split: the rows' lengths and the concatenated arrays (int32 ids, int8 types)."""
    ids, types, special = tokens
    arrays = {"lengths": np.fromiter(map(len, ids), dtype=np.int64, count=len(ids)),
              "ids": np.concatenate(ids).astype(np.int32) if ids else np.zeros(0, np.int32),
              "special": np.concatenate(special) if special else np.zeros(0, bool)}
    if types is not None:
        arrays["types"] = np.concatenate(types).astype(np.int8) if types else np.zeros(0, np.int8)
    path.parent.mkdir(parents=True, exist_ok=True)
    with kio.atomic_path(path) as tmp, open(tmp, "wb") as f:
        np.savez(f, **arrays)


def _load_tokens(path: Path) -> Tokens:
    with np.load(path) as z:
        cuts = np.cumsum(z["lengths"])[:-1]
        ids = np.split(z["ids"].astype(np.int64), cuts)
        types = np.split(z["types"].astype(np.int64), cuts) if "types" in z else None
        special = np.split(z["special"], cuts)
    return ids, types, special


def _token_importance(tokenizer, split: Split, max_length: int, ids) -> list[np.ndarray]:
    """Map the synthetic task's per-word importance onto the tokens (specials get 0).

    Through character offsets, so every tokenizer kind works the same way (WordPiece, byte-level
    BPE whose tokens carry the space before a word, SentencePiece's "▁"): a token belongs to the
    word holding its last character; a token of whitespace only, to the word that follows."""
    enc = tokenizer(split.text_a, split.text_b, truncation=True, max_length=max_length,
                    return_offsets_mapping=True)
    out = []
    for row, importance in enumerate(split.importance):
        if enc["input_ids"][row] != ids[row].tolist():
            raise RuntimeError(f"{split.source}: tokenization with offsets differs at row {row}")
        texts = [split.text_a[row]] + ([] if split.text_b is None else [split.text_b[row]])
        word_at = [_word_index(text) for text in texts]
        first = [0, len(texts[0].split(" "))]            # index of each text's first word
        labels = np.zeros(len(ids[row]), dtype=np.int64)
        for i, (seq, (start, end)) in enumerate(zip(enc.sequence_ids(row),
                                                    enc["offset_mapping"][row])):
            if seq is not None:
                labels[i] = importance[first[seq] + word_at[seq][max(end - 1, start)]]
        out.append(labels)
    return out


def _word_index(text: str) -> np.ndarray:
    """For each character of a space-separated text (and one past its end), the index of its
    word; a space counts with the word after it."""
    return np.minimum(np.cumsum([c == " " for c in text + " "]), text.count(" "))


def collate(examples: Examples, idx: list[int], pad_id: int) -> dict[str, torch.Tensor]:
    """Pad the rows `idx` to their longest one."""
    rows = [examples.input_ids[i] for i in idx]
    width = max(len(r) for r in rows)
    n = len(rows)
    input_ids = np.full((n, width), pad_id, dtype=np.int64)
    attention = np.zeros((n, width), dtype=np.int64)
    special = np.ones((n, width), dtype=bool)       # padding counts as special: never labelled
    for j, (i, r) in enumerate(zip(idx, rows)):
        input_ids[j, : len(r)] = r
        attention[j, : len(r)] = 1
        special[j, : len(r)] = examples.special[i]
    batch = {"input_ids": torch.from_numpy(input_ids), "attention_mask": torch.from_numpy(attention),
             "special_mask": torch.from_numpy(special),
             "labels": torch.from_numpy(examples.labels[np.asarray(idx)]),
             "rows": torch.as_tensor(idx, dtype=torch.int64)}
    if examples.token_type_ids is not None:
        types = np.zeros((n, width), dtype=np.int64)
        for j, i in enumerate(idx):
            types[j, : len(examples.token_type_ids[i])] = examples.token_type_ids[i]
        batch["token_type_ids"] = torch.from_numpy(types)
    if examples.ssa_labels is not None:
        ssa = np.full((n, width), IGNORE, dtype=np.int64)
        for j, i in enumerate(idx):
            ssa[j, : len(examples.ssa_labels[i])] = examples.ssa_labels[i]
        batch["ssa_labels"] = torch.from_numpy(ssa)
    return batch


def length_grouped_batches(lengths: np.ndarray, batch_size: int, rng: np.random.Generator,
                           megabatch: int = 50) -> list[list[int]]:
    """Shuffle, cut into mega-batches of `megabatch` batches, sort each by length, cut batches,
    shuffle the batch order. Random like plain shuffling at the scale of an epoch, but each batch
    holds rows of similar length, so padding is a few percent instead of half."""
    order = rng.permutation(len(lengths))
    size = batch_size * megabatch
    batches = []
    for start in range(0, len(order), size):
        chunk = order[start:start + size]
        chunk = chunk[np.argsort(-lengths[chunk], kind="stable")]
        batches += [chunk[i:i + batch_size].tolist() for i in range(0, len(chunk), batch_size)]
    return [batches[i] for i in rng.permutation(len(batches))]


def random_batches(n: int, batch_size: int, rng: np.random.Generator) -> list[list[int]]:
    order = rng.permutation(n)
    return [order[i:i + batch_size].tolist() for i in range(0, n, batch_size)]


def sorted_batches(lengths: np.ndarray, batch_size: int) -> list[list[int]]:
    """Longest first: the first batch shows the peak memory at once, padding is minimal."""
    order = np.argsort(-lengths, kind="stable")
    return [order[i:i + batch_size].tolist() for i in range(0, len(order), batch_size)]
