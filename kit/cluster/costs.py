"""What one grid point costs, before it runs (kit.plan): its data's rows and token lengths, the
work they make (optimizer steps, SSA's probing and extra examples, evaluation), and the disk the
run keeps. Times come from kit.train.model_probe; this module counts.

Rows are the task's files' rows (what load_task_data reads, max_train_examples applied); where
the files are absent (a task the hub would give), GLUE's official counts, labelled so, and the
length is then max_length (an upper bound). Lengths are the tokens the model's own tokenizer
makes of up to SAMPLE_ROWS training rows, batched as the loop batches them (length-grouped, each
batch padded to its longest row): the mean padded length of a training batch.
"""
from __future__ import annotations

import functools
import math
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from kit import methods
from kit.config.run_config import ConfigError, RunConfig
from kit.config.tasks import get_task
from kit.models.backbones import TINY, is_hub_id, model_path
from kit.data.pipeline import (StaticShape, glue_source, length_grouped_batches, load_task_data,
                               source_label)
from kit.runs import label_text

SAMPLE_ROWS = 2000          # training rows tokenized for the mean length (evenly spaced)
LENGTH_CLASS = 8            # probes are timed at multiples of it and shared by the points
# GLUE's official split sizes (train, each dev split, each test split), used only where the
# task's files are absent: gluebenchmark.com's tasks as nyu-mll/glue holds them
OFFICIAL_ROWS = {
    "CoLA": (8551, (1043,), (1063,)), "SST-2": (67349, (872,), (1821,)),
    "MRPC": (3668, (408,), (1725,)), "STS-B": (5749, (1500,), (1379,)),
    "QQP": (363846, (40430,), (390965,)), "MNLI": (392702, (9815, 9832), (9796, 9847)),
    "QNLI": (104743, (5463,), (5463,)), "RTE": (2490, (277,), (3000,)),
    "WNLI": (635, (71,), (146,))}
OFFICIAL = "GLUE's official counts (files absent)"
GB = 1024 ** 3               # a GiB (2**30 bytes): sizes are printed in GiB


@dataclass(frozen=True)
class TaskFacts:
    train_rows: int
    dev_rows: int                  # every dev split
    test_rows: int                 # every test split the run predicts
    train_length: float            # mean padded length of a training batch
    eval_length: float             # mean tokens of a training row (SSA probes them, sorted)
    dev_length: float              # mean tokens of a dev (and test) row (evaluated sorted)
    counts: str                    # "files" or OFFICIAL
    source: str                    # where the files come from (kit.data.pipeline.source_label)
    tokenize_s: float              # seconds to tokenize every row of the splits read (the
                                   # token cache's work: once a task, kit.plan)
    prediction_bytes: int          # dev (+ test) prediction files' bytes


def token_key(cfg: RunConfig) -> RunConfig:
    """The fields a task's tokens depend on (its texts, the model's tokenizer, max_length: what
    kit.data.token_cache keys them by); the rest set to their defaults. The points of one key
    tokenize once: the first fills the token cache, the others read it."""
    keep = ("task", "glue_dir", "max_train_examples", "max_length", "synthetic_size",
            "synthetic_spurious", "synthetic_distractors", "predict_test", "model",
            "csv_path", "csv_text_columns", "csv_target", "csv_regression", "csv_test_path",
            "n_folds", "fold", "csv_fold_column")
    return RunConfig.from_dict({k: getattr(cfg, k) for k in keep})


def task_facts(cfg: RunConfig, tokenizer, shape: StaticShape | None = None) -> TaskFacts:
    """`shape`: the run's length buckets (kit.train.step.static_shape), every batch padded to
    its bucket's length; None: to its longest row. The task is read and its rows sampled once
    per token key (`_read`), whatever the batch size and shape."""
    read = _read(token_key(cfg), tokenizer)
    if isinstance(read, TaskFacts):             # GLUE's official counts: no rows to measure
        return read
    # evaluated rows in sorted batches: each row's length stands for its batch's longest
    return replace(read.facts, train_length=_padded_mean(read.lengths, cfg.batch_size, shape),
                   eval_length=float(np.mean(_bucketed(read.lengths, shape))),
                   dev_length=float(np.mean(_bucketed(read.dev_lengths, shape))))


@dataclass(frozen=True)
class _Rows:
    """A task's files as read: its facts but the lengths (placeholders), and the sampled token
    counts of its training rows and of its evaluated (dev, test) rows."""
    facts: TaskFacts
    lengths: np.ndarray
    dev_lengths: np.ndarray


@functools.lru_cache(maxsize=None)
def _read(cfg: RunConfig, tokenizer) -> TaskFacts | _Rows:
    task = get_task(cfg.task) if cfg.task.lower() != "csv" else None
    source = (glue_source(cfg.glue_dir, task.name, cfg.reads_test)
              if task and task.kind == "glue" else None)
    if source == "hub" and task.name in OFFICIAL_ROWS:
        train, dev, test = OFFICIAL_ROWS[task.name]
        train = min(train, cfg.max_train_examples or train)
        rows = sum(dev) + (sum(test) if cfg.predict_test else 0)
        return TaskFacts(train, sum(dev), sum(test) if cfg.predict_test else 0, cfg.max_length,
                         cfg.max_length, cfg.max_length, OFFICIAL, source_label(source), 0.0,
                         _prediction_bytes(task, [str(i) for i in range(rows)], rows))
    data = load_task_data(cfg)
    dev = [r for split in data.dev.values() for r in split.ids]
    test = [r for split in data.test.values() for r in split.ids] if cfg.predict_test else []
    lengths, seconds = _lengths(tokenizer, data.train, cfg.max_length)
    # dev sentences are not training rows' lengths (SST-2's training phrases are half as long)
    evaluated = [*data.dev.values(), *(data.test.values() if cfg.predict_test else ())]
    dev_lengths = np.concatenate([_lengths(tokenizer, split, cfg.max_length)[0]
                                  for split in evaluated]) if evaluated else lengths
    rows = len(data.train) + len(dev) + len(test)
    where = source_label(source) if source is not None else data.train.source
    facts = TaskFacts(len(data.train), len(dev), len(test), 0.0, 0.0, 0.0, "files", where,
                      seconds * rows / len(lengths),
                      _prediction_bytes(data.task, dev, len(dev)) +
                      _prediction_bytes(data.task, test, len(test)))
    return _Rows(facts, lengths, dev_lengths)


def _lengths(tokenizer, train, max_length: int) -> tuple[np.ndarray, float]:
    """Token counts of up to SAMPLE_ROWS evenly spaced rows of a split, and the seconds taken."""
    pick = np.unique(np.linspace(0, len(train) - 1, min(SAMPLE_ROWS, len(train))).astype(int))
    sample = train.subset(pick)
    started = time.perf_counter()
    enc = tokenizer(sample.text_a, sample.text_b, truncation=True, max_length=max_length)
    return (np.fromiter(map(len, enc["input_ids"]), dtype=np.int64),
            max(time.perf_counter() - started, 1e-6))


def _padded_mean(lengths: np.ndarray, batch_size: int, shape: StaticShape | None) -> float:
    """Mean over the loop's training batches (length-grouped) of the batch's longest row, or of
    its bucket's length (`shape`)."""
    batches = length_grouped_batches(lengths, batch_size, np.random.default_rng(0))
    return float(np.mean(_bucketed(np.array([lengths[b].max() for b in batches]), shape)))


def _bucketed(lengths: np.ndarray, shape: StaticShape | None) -> np.ndarray:
    """Lengths as the batches are padded: to their bucket's (`shape`), else as they are."""
    return lengths if shape is None else np.array([shape.length(int(n)) for n in lengths])


def _prediction_bytes(task, ids: list[str], rows: int) -> int:
    """The prediction files' size: `index<TAB>prediction<TAB>label` rows as kit.runs writes
    them, the longest label text of the task standing for every row's."""
    if not rows:
        return 0
    label = max((label_text(task, v) for v in (range(len(task.labels)) if task.labels
                                                else (-1.2345678,))), key=len)
    return sum(len(i) for i in ids) + rows * (2 * len(label) + 3)


@dataclass(frozen=True)
class Work:
    epochs: int
    steps: int                     # training batches over every epoch
    train_rows: int                # rows trained over every epoch
    extra_rows: int                # SSA / BERT-mask: masked variants over every epoch (gamma)
    eval_rows: int                 # rows evaluated (dev every epoch, test once, SSA probing)
    probe_rows: int                # of them SSA's probing of training rows and variants


def work(cfg: RunConfig, facts: TaskFacts) -> Work:
    """The optimizer's batches and the rows evaluated: BERT-mask's epochs from ssa_start_epoch
    grow by gamma masked copies a row (capped by the `equal_steps` budget); SSA (the paper's
    rule) probes the training rows and gamma masked variants of each kept one - counted as
    every row kept, an upper bound - and trains them as extra rows only with label_merge
    `variant`; with `reuse_labels_from` it reads the labels that run saved and probes nothing."""
    kind = methods.get(cfg.method)
    n, epochs, late = facts.train_rows, cfg.epochs, max(cfg.epochs - cfg.ssa_start_epoch, 0)
    variants = round(cfg.gamma * n)
    extra = probe = 0
    if kind.epoch == "masked-copies":
        extra = variants * late
    elif kind.epoch == "ssa-labels" and cfg.label_rule == "paper":
        probe = (n + variants) * late
        extra = variants * late if cfg.label_merge == "variant" else 0
    elif kind.epoch == "ssa-labels":
        probe = 2 * n * late               # the code rule probes copies until enough qualify
    if cfg.reuse_labels_from:
        probe = 0
    trained = n * epochs + (0 if cfg.budget == "equal_steps" else extra)
    per_epoch = [n + (extra // late if late and i >= cfg.ssa_start_epoch
                      and cfg.budget != "equal_steps" else 0) for i in range(epochs)]
    steps = sum(math.ceil(rows / cfg.batch_size) for rows in per_epoch)
    return Work(epochs, steps, trained, extra, facts.dev_rows * epochs + facts.test_rows + probe,
                probe)


@dataclass(frozen=True)
class Disk:
    kept: int                      # what stays once the run is recorded ok
    peak: int                      # the most it holds while it trains


def disk(cfg: RunConfig, facts: TaskFacts, model_bytes: int, optimizer_bytes: int,
         tokenizer_bytes: int) -> Disk:
    """checkpoint/best (the model's state dict + its tokenizer) where it is kept or predicts
    the test set; checkpoint/last (the model and the optimizer's state) while the run trains,
    written beside the old one and swapped in (two at once); predictions; SSA's saved labels
    (every token's id, type, special mark and label: kit.data.pipeline.Examples)."""
    best = model_bytes + tokenizer_bytes
    last = model_bytes + optimizer_bytes
    labels = 0
    if cfg.save_labels and methods.get(cfg.method).epoch == "ssa-labels":
        per_token = 3 * np.dtype(np.int64).itemsize + np.dtype(bool).itemsize
        late = max(cfg.epochs - cfg.ssa_start_epoch, 0)
        labels = int(late * facts.train_rows * facts.eval_length * per_token)
    kept = facts.prediction_bytes + labels + (best + last if cfg.save_checkpoints else 0)
    uses_best = cfg.save_checkpoints or bool(facts.test_rows)
    return Disk(kept, facts.prediction_bytes + labels + (best if uses_best else 0) + 2 * last)


def length_classes(length: float) -> tuple[int, int, float]:
    """The two length classes (multiples of LENGTH_CLASS) around a mean length and its weight
    between them: (lower, upper, w). Probes time the classes; a point's s/step is the line
    between them at its length (rounding 11.9 tokens to 8 read a step a third short)."""
    lower = max(LENGTH_CLASS, int(length // LENGTH_CLASS) * LENGTH_CLASS)
    return lower, lower + LENGTH_CLASS, min(max((length - lower) / LENGTH_CLASS, 0.0), 1.0)


# ---------------------------------------------------------------- a batch's disk pre-flight

WEIGHT_FILES = ("*.safetensors", "*.bin", "*.pt", "*.h5", "*.msgpack")


def weights_bytes(model: str) -> int | None:
    """The bytes of a model's weight files where they are on this machine (a folder, the
    embedded model, a hub id's cached snapshot), read from the files, no model built; None
    where none are found (a model fetched later, the tiny random model: too small to count)."""
    if model == TINY:
        return None
    folder = Path(model_path(model))
    if is_hub_id(model):
        from huggingface_hub import try_to_load_from_cache
        config = try_to_load_from_cache(model, "config.json")
        if not isinstance(config, str):
            return None
        folder = Path(config).parent
    if not folder.is_dir():
        return None
    # weights are fp32 files: the checkpoint's model is its state dict as written here
    sizes = [f.stat().st_size for pattern in WEIGHT_FILES for f in folder.glob(pattern)]
    return max(sizes, default=0) or None


def checkpoint_disk(cfg: RunConfig, weights: int) -> Disk:
    """A run's checkpoints from its model's weight bytes (`disk` without the probe: AdamW's
    two moments taken as twice the weights, every parameter trained - an upper bound)."""
    return disk(cfg, TaskFacts(0, 0, int(cfg.predict_test), 0, 0, 0, "", "", 0.0, 0),
                weights, 2 * weights, 0)


def check_disk(points: list[dict], finished: set[str], outputs: Path) -> None:
    """One ConfigError line when the unfinished points' checkpoints (`disk_needed`) would not
    fit in the outputs folder's free space (kit.batch's pre-flight; --ignore-disk skips it)."""
    needed, counted = disk_needed(points, finished)
    free = shutil.disk_usage(existing(outputs)).free
    if needed > free:
        raise ConfigError(f"{outputs}: the {counted} run(s) to go need {needed / GB:.1f} GiB of "
                          f"disk (their checkpoints: ./run_all.sh plan says per run), "
                          f"{free / GB:.1f} GiB free there; free space, set save_checkpoints: "
                          "false, or pass --ignore-disk")


def existing(path: Path) -> Path:
    """The path, or its nearest existing parent (an outputs folder not made yet)."""
    while not path.exists():
        path = path.parent
    return path


def disk_needed(points: list[dict], finished: set[str]) -> tuple[int, int]:
    """(bytes the unfinished points need - what they keep and one run's peak on top -, how
    many of them are counted): the batch's pre-flight against the outputs folder's free space."""
    kept, peak, counted, sizes = 0, 0, 0, {}
    for point in points:
        cfg = RunConfig.from_dict(point)
        if cfg.run_id in finished or plannable_kind(cfg):
            continue
        if cfg.model not in sizes:
            sizes[cfg.model] = weights_bytes(cfg.model)
        if sizes[cfg.model] is None:
            continue
        got = checkpoint_disk(cfg, sizes[cfg.model])
        kept, peak, counted = kept + got.kept, max(peak, got.peak - got.kept), counted + 1
    return kept + peak, counted


def plannable_kind(cfg: RunConfig) -> str | None:
    """Why a point is not planned (None: it is): multi-task and pretraining points."""
    kind = methods.get(cfg.method)
    return ("multi-task" if kind.multitask else "masked-LM pretraining" if kind.pretrain
            else None)


# ---------------------------------------------------------------- a SLURM task's request

def task_memory(probes, margin: float, workers: int = 1) -> str:
    """sbatch's --mem (GiB, per task: per node for a job of several) for a task that runs
    `workers` points at once (per_device K) or one point on `workers` processes: each holds the
    probes' peak memory (CPU) or, beside a GPU, host memory for the weights and data (4x the
    model's bytes), x `margin` + 2 GiB (the interpreter and its libraries), at least 4 GiB."""
    probes = list(probes)
    gpu = any(p["device"].startswith("cuda") for p in probes)
    memory = max((p["model_bytes"] * 4 if gpu else p["peak_memory_bytes"] for p in probes),
                 default=0)
    return f"{max(4, math.ceil(memory * workers * margin / GB) + 2)}G"


def seconds_on_nodes(point: dict, nodes: int) -> float:
    """A planned point's seconds on each of `nodes` nodes that run it together (kit.batch
    --nodes): every rank takes a slice of each batch (kit.train.step.shard), so its training
    and evaluation take 1/N of the time planned on one; building the model, tokenizing,
    checkpoint writes and its notebook are each node's whole. A rank's smaller batch and the
    gradients' all-reduce are not probed: --time's margin holds them."""
    split = point.get("train_s", 0.0) + point.get("eval_s", 0.0)
    return point["seconds"] - split * (1 - 1 / nodes)
