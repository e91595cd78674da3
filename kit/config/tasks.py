"""Task registry: the nine GLUE tasks, the generated synthetic tasks and CSV tasks.

A Task says where the text is, what the labels are and how the task is scored. It holds no
data; the readers (kit.data.readers, kit.data.hub, kit.data.csv_reader) and the synthetic generator
(kit.data.synthetic) produce `Split`s.
"""
from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Task:
    name: str                          # canonical name, e.g. "RTE"
    text_columns: tuple[str, ...]      # one column (single sentence) or two (sentence pair)
    labels: tuple[str, ...] | None     # label strings in class-id order; None = regression
    metrics: tuple[str, ...]           # official metrics, in the paper's order (F1 before acc)
    dev_splits: tuple[str, ...] = ("dev",)
    test_splits: tuple[str, ...] = ("test",)
    hub_config: str | None = None      # config name of `nyu-mll/glue` on the hub
    kind: str = "glue"                 # glue | synthetic | csv

    @property
    def regression(self) -> bool:
        return self.labels is None

    @property
    def num_labels(self) -> int:
        return 1 if self.labels is None else len(self.labels)

    @property
    def is_pair(self) -> bool:
        return len(self.text_columns) == 2

    def splits(self, test: bool = True) -> tuple[str, ...]:
        """The splits a run of the task needs, in order: train, every dev split, and every
        test split where `test` (a run that predicts or pretrains on test text; `fetch` writes
        them all). The one rule of which files make a task present in a GLUE folder."""
        return ("train", *self.dev_splits, *(self.test_splits if test else ()))


@dataclass
class Split:
    """One split of a task, as plain columns. `labels` is None for unlabelled (test) files."""
    text_a: list[str]
    text_b: list[str] | None
    labels: np.ndarray | None          # int64 class ids, or float32 targets for regression
    ids: list[str]                     # row ids (the GLUE `index` column, or row numbers)
    source: str                        # file or hub id it came from, for messages
    importance: list[list[int]] | None = None  # synthetic only: 0/1 per whitespace word of a+b
    folds: np.ndarray | None = None    # CSV only: fold id per row when the file has one
    extra: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.text_a)

    def subset(self, idx) -> "Split":
        idx = np.asarray(idx, dtype=np.int64)
        pick = lambda xs: None if xs is None else [xs[i] for i in idx]  # noqa: E731
        return Split(
            text_a=pick(self.text_a), text_b=pick(self.text_b),
            labels=None if self.labels is None else self.labels[idx],
            ids=pick(self.ids), source=self.source, importance=pick(self.importance),
            folds=None if self.folds is None else self.folds[idx], extra=dict(self.extra))


@dataclass
class TaskData:
    """A task with its splits, as a run reads them (kit.data.pipeline.load_task_data)."""
    task: Task
    train: Split
    dev: dict[str, Split]              # dev split name -> split (MNLI has two)
    test: dict[str, Split]


_BIN = ("0", "1")
_ENT2 = ("entailment", "not_entailment")
GLUE_TASKS: dict[str, Task] = {t.name: t for t in [
    Task("CoLA", ("sentence",), _BIN, ("mcc",), hub_config="cola"),
    Task("SST-2", ("sentence",), _BIN, ("accuracy",), hub_config="sst2"),
    Task("MRPC", ("sentence1", "sentence2"), _BIN, ("f1", "accuracy"), hub_config="mrpc"),
    Task("STS-B", ("sentence1", "sentence2"), None, ("pearson", "spearman"), hub_config="stsb"),
    Task("QQP", ("question1", "question2"), _BIN, ("f1", "accuracy"), hub_config="qqp"),
    Task("MNLI", ("sentence1", "sentence2"), ("contradiction", "entailment", "neutral"),
         ("accuracy",), dev_splits=("dev_matched", "dev_mismatched"),
         test_splits=("test_matched", "test_mismatched"), hub_config="mnli"),
    Task("QNLI", ("question", "sentence"), _ENT2, ("accuracy",), hub_config="qnli"),
    Task("RTE", ("sentence1", "sentence2"), _ENT2, ("accuracy",), hub_config="rte"),
    Task("WNLI", ("sentence1", "sentence2"), _BIN, ("accuracy",), hub_config="wnli"),
]}

SYNTHETIC_TASKS: dict[str, Task] = {t.name: t for t in [
    Task("synthetic", ("sentence",), ("negative", "positive"), ("accuracy",),
         test_splits=(), kind="synthetic"),
    Task("synthetic-pair", ("sentence1", "sentence2"), ("different", "same"), ("accuracy",),
         test_splits=(), kind="synthetic"),
]}

# Tasks that are not in the registry but are valid `task` values (kit.config.run_config handles
# them).
SPECIAL_TASKS = ("csv", "multitask")


def _name_key(name: str) -> str:
    """What two spellings of one task share: lower case, no dashes, underscores or spaces
    (sst2, sst-2, SST2, Sst_2 -> sst2; stsb, STS-B -> stsb)."""
    return re.sub(r"[-_\s]", "", name.lower())


def csv_task(text_columns: tuple[str, ...], labels: tuple[str, ...] | None,
             metric: str = "") -> Task:
    """A task over the user's own CSV: regression when `labels` is None, else classification.
    `metric` (csv_metric) alone selects the best epoch; "" keeps the defaults (rmse; the mean of
    accuracy and macro F1). kit.train.metrics scores rmse as -rmse: lower is better."""
    if metric == "f1" and labels is not None and len(labels) != 2:
        raise ValueError(f"csv_metric 'f1' is the F1 of class 1 of two; the target has "
                         f"{len(labels)} classes: use f1_macro")
    metrics = ((metric,) if metric else
               ("rmse", "pearson") if labels is None else ("accuracy", "f1_macro"))
    return Task("csv", tuple(text_columns), labels, metrics, test_splits=(), kind="csv")


def get_task(name: str) -> Task:
    """Look a task up by name, ignoring case, dashes and underscores (`rte`, `SST-2`, `sst2` ...)."""
    key = _name_key(name)
    for table in (GLUE_TASKS, SYNTHETIC_TASKS):
        for task_name, task in table.items():
            if _name_key(task_name) == key:
                return task
    names = [*GLUE_TASKS, *SYNTHETIC_TASKS, *SPECIAL_TASKS]
    close = difflib.get_close_matches(key, [_name_key(n) for n in names], n=1, cutoff=0.6)
    hint = next((f" (did you mean {n!r}?)" for n in names if close and _name_key(n) == close[0]), "")
    raise ValueError(f"unknown task {name!r}: choose one of {', '.join(names)}{hint}")


def canonical_task_name(name: str) -> str:
    """The registry's spelling of a task name (sst2 -> SST-2, CSV -> csv), so that every
    spelling of one experiment gives one run id; ValueError for an unknown task."""
    if _name_key(name) in SPECIAL_TASKS:
        return _name_key(name)
    return get_task(name).name
