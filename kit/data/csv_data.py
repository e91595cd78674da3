"""A user's CSV file as a task: its columns, train and dev (a seeded split or k folds), and an
optional test file whose predictions become submission.csv (`write_csv_submission`)."""
from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path

import numpy as np

from kit import io as kio
from kit.config.paths import input_path
from kit.data import readers
from kit.config.run_config import RunConfig
from kit.config.tasks import TaskData, csv_task


@dataclass(frozen=True)
class CsvSource:
    """A user's CSV task: RunConfig's csv_* knobs without their prefix."""
    path: str
    text_columns: tuple[str, ...]
    target: str
    regression: bool
    metric: str
    fold_column: str
    test_path: str
    id_column: str

    @classmethod
    def from_config(cls, cfg: RunConfig) -> "CsvSource":
        """The config's csv_* knobs; a relative csv_path / csv_test_path is the project's
        (kit.config.paths.input_path: the same file from notebooks/ as from the project)."""
        source = cls(**{f.name: getattr(cfg, f"csv_{f.name}") for f in fields(cls)})
        return replace(source, **{name: str(input_path(value)) if value else value
                                  for name, value in (("path", source.path),
                                                      ("test_path", source.test_path))})


def load_csv(csv: CsvSource, n_folds: int, fold: int, seed: int) -> TaskData:
    """A user's CSV as train + dev. Without folds (n_folds 0): a split 80/20 seeded with the
    run's `seed`. With n_folds k: dev is the rows of fold `fold`, train every other row. Fold
    ids come from `csv.fold_column` when given (its sorted distinct values become 0..), else
    kit.data.folds assigns them with a FIXED seed 0, stratified on the classes (classification) or
    on quantile bins of the target (regression): folds are a property of the data, so every
    seed of a grid validates on the same rows and one seed's k runs give out-of-fold
    predictions for every row. A `csv.test_path` file is the test split (its ids from
    `csv.id_column`): submission.csv."""
    # pandas (the reader's, the folds') only for a CSV task: every run imports this module
    from kit.data import csv_reader
    from kit.data.folds import assign_folds
    if csv.target:
        split, labels = csv_reader.read_csv_split(csv.path, csv.text_columns, csv.target,
                                                  csv.regression, csv.fold_column or None)
    else:       # text only (masked-LM pretraining; kit.config.rules allows no target there)
        split, labels = csv_reader.read_csv_text(csv.path, csv.text_columns), None
    try:
        task = csv_task(csv.text_columns, None if csv.regression else labels, csv.metric)
    except ValueError as err:                # csv_metric f1 on more than two classes
        raise readers.DataError(f"{csv.path}: {err}") from None
    test = ({"test": csv_reader.read_csv_test(csv.test_path, csv.text_columns, csv.id_column)}
            if csv.test_path else {})
    if not n_folds:
        order = np.random.default_rng(seed).permutation(len(split))
        n_dev = max(len(split) // 5, 1)    # without folds: a seeded 80/20 split
        return TaskData(task, split.subset(order[n_dev:]), {"dev": split.subset(order[:n_dev])},
                        test)
    try:
        folds = assign_folds(n_folds, seed=0, labels=split.labels, regression=csv.regression,
                             given=split.folds)
    except ValueError as err:          # too few rows or fold values: say which file
        raise readers.DataError(f"{csv.path}: cannot make {n_folds} folds ({err})") from None
    split.folds = folds
    dev = np.flatnonzero(folds == fold)
    if not len(dev) or len(dev) == len(split):
        raise readers.DataError(f"{csv.path}: fold {fold} holds {len(dev)} of "
                                f"{len(split)} rows; dev and train must both be non-empty")
    train = np.flatnonzero(folds != fold)
    return TaskData(task, split.subset(train), {"dev": split.subset(dev)}, test)


def write_csv_submission(path: str | os.PathLike, ids: Sequence[str], predictions: Sequence,
                         id_column: str, target: str) -> Path:
    """`id_column,target` with one row per test id, in the given order, written atomically."""
    import pandas as pd
    path = Path(path)
    frame = pd.DataFrame({id_column: list(ids), target: list(predictions)})
    kio.write_text(path, frame.to_csv(index=False))
    return path
