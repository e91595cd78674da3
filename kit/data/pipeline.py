"""From a config to tokenized examples and batches.

Texts are tokenized once per run into unpadded id arrays (`Examples`); every batch is padded only to
its own longest row. Training batches are length-grouped (shuffled mega-batches sorted by length),
so almost every token in a batch is a real one; evaluation batches are fully sorted. A user's CSV
task is read by kit.data.csv_data; tokenized splits are kept on disk by kit.data.token_cache.
Batches become torch tensors in kit.data.tensors: this module loads no torch, so a batch's
pre-flight reads and checks data without it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from kit.config.paths import PROJECT, input_path
from kit.data import hub, readers, synthetic, token_cache
from kit.config.run_config import RunConfig
from kit.data.csv_data import CsvSource, load_csv
from kit.config.tasks import Split, Task, TaskData, get_task

IGNORE = -100  # label of positions that no loss looks at


# The project's own copy of the real GLUE files (data/glue/SOURCES.md): a fresh clone runs offline.
PROJECT_GLUE = PROJECT / "data" / "glue"


def glue_source(glue_dir: str, task: str = "", test: bool = False) -> str | Path:
    """Where a GLUE task's files are read from, per task, first match wins: the `glue_dir`
    parameter, else $GLUE_DIR, when it has a <TASK>/ folder; else the project's data/glue when
    it holds the task whole (QNLI's train is not staged: QNLI comes from the hub until `fetch
    QNLI`); else the hub ("hub"). Whole: every file of Task.splits(test), `test` where the run
    reads its test split (RunConfig.reads_test). A folder that is named but does not exist, or
    whose <TASK>/ lacks a file the run needs, is one DataError line, never a fall-through to
    the next source (a user's edited copy would train on the original). A relative folder is
    the project's (kit.config.paths.input_path), from notebooks/ too. Without `task`: the first
    folder named, else the hub."""
    if glue_dir == "hub":
        return "hub"
    named = _named_folders(glue_dir)
    if not task:
        return named[0][1] if named else "hub"
    info = get_task(task)
    for origin, folder in named:
        if (folder / info.name).exists():
            _check_whole(origin, folder, info, test)
            return folder
    return "hub" if readers.missing_files(PROJECT_GLUE, info, test) else PROJECT_GLUE


def _named_folders(glue_dir: str) -> list[tuple[str, Path]]:
    """(origin, folder) of the `glue_dir` parameter and $GLUE_DIR, where set; one that does
    not exist is an error."""
    named = []
    for origin, chosen in (("glue_dir", glue_dir), ("GLUE_DIR", os.environ.get("GLUE_DIR", ""))):
        if chosen:
            path = input_path(chosen)
            if not path.is_dir():
                raise readers.DataError(f"{origin}={chosen}: no such folder; point it at the "
                                        "folder holding the <TASK>/ subfolders, or unset it to "
                                        f"use the project's copy ({PROJECT_GLUE})")
            named.append((f"{origin}={chosen}", path))
    return named


def _check_whole(origin: str, folder: Path, task: Task, test: bool) -> None:
    """A named folder's <TASK>/ must hold every file the run reads (MissingTaskFiles)."""
    lack = readers.missing_files(folder, task, test)
    if lack:
        files = ", ".join(f"{s}.tsv" for s in task.splits(test))
        raise readers.MissingTaskFiles(
            f"{origin}: {readers.lacking(lack)}; a run of {task.name} reads {files} there and "
            f"from no other copy: add them (./run_all.sh fetch {task.name} --glue-dir "
            f"{folder}) or move {folder / task.name} away")


def source_label(source: str | Path) -> str:
    """A task's source in words, for the batch's line and metrics.json: the folder, or the hub."""
    if source == "hub":
        return "the hub (nyu-mll/glue)"
    return "data/glue (the project's copy)" if Path(source) == PROJECT_GLUE else str(source)


def sources_line(cfgs: list[RunConfig]) -> str | None:
    """`data: RTE from data/glue (the project's copy); MRPC from /x/glue`: each GLUE task of a
    batch once, where its files come from (glue_source); None without a GLUE task."""
    seen = {}
    for cfg in cfgs:
        for name in cfg.tasks or (cfg.task,):
            task = get_task(name) if name.lower() != "csv" else None
            if task is not None and task.kind == "glue" and (name, cfg.glue_dir) not in seen:
                where = source_label(glue_source(cfg.glue_dir, name, cfg.reads_test))
                seen[name, cfg.glue_dir] = f"{name} from {where}"
    return "data: " + "; ".join(seen.values()) if seen else None


def load_task_data(cfg: RunConfig) -> TaskData:
    """A run's task and splits, train capped to `max_train_examples`: the config is unpacked
    here; the loaders below take the values they use."""
    if cfg.task.lower() == "csv":
        data = load_csv(CsvSource.from_config(cfg), cfg.n_folds, cfg.fold, cfg.seed)
    else:
        task = get_task(cfg.task)
        if task.kind == "synthetic":
            data = _load_synthetic(task, cfg.synthetic_size, cfg.synthetic_spurious,
                                   cfg.synthetic_distractors)
        else:
            source = glue_source(cfg.glue_dir, task.name, cfg.reads_test)
            data = _load_glue(task, source, cfg.reads_test)
    return replace(data, train=_cap(data.train, cfg.max_train_examples))


def _load_synthetic(task: Task, size: int, spurious: float, distractors: int) -> TaskData:
    hard = dict(spurious=spurious, distractors=distractors)
    train = synthetic.generate(task.is_pair, size, "train", **hard)
    dev = synthetic.generate(task.is_pair, max(size // 4, 8), "dev", **hard)
    return TaskData(task, train, {"dev": dev}, {})


def _load_glue(task: Task, source: str | Path, predict_test: bool) -> TaskData:
    def read(split: str) -> Split:
        if source == "hub":
            return hub.read_hub_split(task, split)
        return readers.read_glue_split(task, split, source)

    train = read("train")
    dev = {name: read(name) for name in task.dev_splits}
    test = {name: read(name) for name in task.test_splits} if predict_test else {}
    return TaskData(task, train, dev, test)


def _cap(train: Split, max_examples: int) -> Split:
    """The first `max_examples` of a fixed shuffle (fixed: the same subset for every seed);
    0 keeps every row."""
    if not max_examples or max_examples >= len(train):
        return train
    order = np.random.default_rng(0).permutation(len(train))[:max_examples]
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
    With `cache_dir` (kit.data.token_cache.token_cache_dir), the token arrays are kept there for the
    next run: every point of a grid reads the same split."""
    return encode_counted(tokenizer, split, max_length, regression, cache_dir)[0]


def encode_counted(tokenizer, split: Split, max_length: int, regression: bool,
                   cache_dir: str | Path | None = None
                   ) -> tuple[Examples, token_cache.Truncation]:
    """`encode`, and how many of the split's rows max_length truncated (kept in the cache too)."""
    tokens = (token_cache.tokenize_cached(tokenizer, split, max_length, Path(cache_dir))
              if cache_dir else token_cache.tokenize(tokenizer, split, max_length))
    ids, types, special, full_lengths = tokens
    if split.labels is None:
        labels = np.zeros(len(ids), dtype=np.float32 if regression else np.int64)
    else:
        labels = split.labels.astype(np.float32 if regression else np.int64)
    importance = None
    if split.importance is not None:
        importance = _token_importance(tokenizer, split, max_length, ids)
    return (Examples(ids, types, special, labels, importance=importance),
            token_cache.Truncation.of(full_lengths, max_length))


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


def real_positions(rows: list[np.ndarray], width: int | None = None) -> np.ndarray:
    """[rows, width (default: the longest row)] bool: True where a row has a token, False on
    its padding."""
    lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
    return np.arange(lengths.max(initial=0) if width is None else width) < lengths[:, None]


def pad_rows(rows: list[np.ndarray], fill, dtype=None, real: np.ndarray | None = None
             ) -> np.ndarray:
    """[rows, longest row] array of `dtype` (default: the first row's; int64 for no rows), each
    row left-aligned and `fill` after its end (`real`: real_positions(rows), when known). One
    scatter through the mask of real positions, not a loop over rows: on a batch of short rows
    it is ~4x faster than torch's pad_sequence, whose per-row cost dominates there."""
    real = real_positions(rows) if real is None else real
    out = np.full(real.shape, fill, dtype=dtype or (rows[0].dtype if rows else np.int64))
    if rows:
        out[real] = np.concatenate(rows)
    return out


def unpad(matrix: np.ndarray, lengths: np.ndarray) -> list[np.ndarray]:
    """pad_rows undone: row i's first lengths[i] entries, as a copy."""
    return [matrix[i, :n].copy() for i, n in enumerate(lengths)]


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


@dataclass(frozen=True)
class StaticShape:
    """Batches of a few fixed shapes (RunConfig.length_buckets): lengths padded up to a multiple
    of `step` (at most max_length: that many buckets), and `rows` rows a batch, a short batch
    (an epoch's last) padded with rows of weight 0. On a GPU each new [rows, length] shape costs
    a first use (kernel selection, allocator, compile); length-grouped batches make almost every
    length its own shape. 0 rows: as many as the batch has."""
    max_length: int
    rows: int = 0
    step: int = 16

    def length(self, longest: int) -> int:
        return min(-(-longest // self.step) * self.step, max(self.max_length, longest))

    def buckets(self) -> list[int]:
        return sorted({self.length(n) for n in range(1, self.max_length + 1)})


def sorted_batches(lengths: np.ndarray, batch_size: int) -> list[list[int]]:
    """Longest first: the first batch shows the peak memory at once, padding is minimal."""
    order = np.argsort(-lengths, kind="stable")
    return [order[i:i + batch_size].tolist() for i in range(0, len(order), batch_size)]
