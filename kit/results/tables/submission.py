"""Test predictions as the GLUE server and a Kaggle-style task take them.

A run with `predict_test: true` writes `predictions/<test split>.tsv` (`index<TAB>prediction`,
label strings; STS-B scores); a multi-task run writes `predictions/<TASK>/<test split>.tsv`.
The GLUE server (gluebenchmark.com) takes one file per task, named as below, each with the
header `index<TAB>prediction` and one row per test example: the label strings of the GLUE data
(entailment / not_entailment for QNLI and RTE; entailment / neutral / contradiction for MNLI;
0 / 1 for CoLA, SST-2, MRPC, QQP, WNLI) and a float for STS-B. `read_test_predictions` checks
one such file (header, label strings, unique indices); kit.results.tables.glue_zips packs the
checked files into the zips the server takes. Reads only outputs/ (no torch).

Kaggle-style CSV tasks: a run with `csv_test_path` writes `submission.csv` (`<csv_id_column>,
<csv_target>`, the test file's ids in file order, class names or floats) from its best
checkpoint (kit.data.csv_data.write_csv_submission); `average_fold_submissions` turns the
finished fold runs of a k-fold set into one submission (the CommonLit recipe: the mean of the
folds' predictions; for classification the most common class, ties to the first class in
sorted order).
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from kit import io as kio
from kit import runs
from kit.config.tasks import GLUE_TASKS

# (task, test split) -> the file name the GLUE server expects.
SUBMISSION_FILES = {
    ("CoLA", "test"): "CoLA.tsv", ("SST-2", "test"): "SST-2.tsv", ("MRPC", "test"): "MRPC.tsv",
    ("STS-B", "test"): "STS-B.tsv", ("QQP", "test"): "QQP.tsv",
    ("MNLI", "test_matched"): "MNLI-m.tsv", ("MNLI", "test_mismatched"): "MNLI-mm.tsv",
    ("QNLI", "test"): "QNLI.tsv", ("RTE", "test"): "RTE.tsv", ("WNLI", "test"): "WNLI.tsv",
}
# Rows of the GLUE test sets (the official test.tsv files; AX: diagnostic-full.tsv).
GLUE_TEST_ROWS = {
    "CoLA.tsv": 1063, "SST-2.tsv": 1821, "MRPC.tsv": 1725, "STS-B.tsv": 1379,
    "QQP.tsv": 390965, "MNLI-m.tsv": 9796, "MNLI-mm.tsv": 9847, "QNLI.tsv": 5463,
    "RTE.tsv": 3000, "WNLI.tsv": 146, "AX.tsv": 1104,
}
HEADER = ("index", "prediction")


class SubmissionError(ValueError):
    """A prediction file that the GLUE server would reject; names the file and the problem."""


def read_test_predictions(path: str | os.PathLike, task_name: str) -> pd.DataFrame:
    """A run's test predictions checked for `task_name`: header `index<TAB>prediction`, unique
    indices, every prediction one of the task's label strings (STS-B: a finite float). Returns
    the two columns as strings, in file order."""
    path = Path(path)
    task = GLUE_TASKS.get(task_name)
    if task is None:
        raise SubmissionError(f"{path}: {task_name!r} is not a GLUE task")
    lines = path.read_text(encoding="utf-8").splitlines()
    if not lines or tuple(lines[0].split("\t")) != HEADER:
        raise SubmissionError(f"{path}: header must be 'index<TAB>prediction', got "
                              f"{lines[0]!r}" if lines else f"{path}: empty file")
    rows = [line.split("\t") for line in lines[1:] if line != ""]
    bad = next((i for i, r in enumerate(rows) if len(r) != 2), None)
    if bad is not None:
        raise SubmissionError(f"{path}: line {bad + 2} has {len(rows[bad])} fields, expected 2")
    frame = pd.DataFrame(rows, columns=list(HEADER), dtype=str)
    duplicated = frame["index"][frame["index"].duplicated()]
    if len(duplicated):
        raise SubmissionError(f"{path}: duplicate index {duplicated.iloc[0]!r}")
    if task.regression:
        values = pd.to_numeric(frame["prediction"], errors="coerce").to_numpy(dtype=float)
        if not np.isfinite(values).all():
            raise SubmissionError(f"{path}: {task_name} predictions must be finite numbers, got "
                                  f"{frame['prediction'][~np.isfinite(values)].iloc[0]!r}")
    else:
        unknown = sorted(set(frame["prediction"]) - set(task.labels))
        if unknown:
            raise SubmissionError(f"{path}: {task_name} labels must be one of "
                                  f"{', '.join(task.labels)}; got {', '.join(unknown[:3])}")
    return frame


# --------------------------------------------------------------------------- Kaggle CSV tasks

def _fold_submission(run_dir: Path) -> tuple[dict, pd.DataFrame] | None:
    """(config, submission) of a finished run with a submission.csv, else None."""
    config, metrics = runs.read_config(run_dir), runs.read_metrics(run_dir)
    path = run_dir / "submission.csv"
    if config is None or (metrics or {}).get("status") != "ok" or not path.exists():
        return None
    frame = pd.read_csv(path, dtype=str, keep_default_na=False)   # ids and classes as text
    return config, frame


def average_fold_submissions(run_dirs: Sequence[str | os.PathLike],
                             out_path: str | os.PathLike | None = None) -> pd.DataFrame:
    """One submission from the finished fold runs among `run_dirs` (e.g.
    `kit.results.tables.fold_tables.fold_run_dirs(config)`; unfinished folds are left out,
    `attrs["folds"]` lists the folds used). Regression: the mean prediction per id; classification:
    the most common class (ties: the first in sorted order). Every fold must hold the same ids in
    the same order. Written to `out_path`, by default
    `<outputs>/submissions/<first run id>-folds.csv` (the first of `run_dirs`: fold 0 of a
    fold_run_dirs list)."""
    run_dirs = [Path(d) for d in run_dirs]
    found = [(d, got) for d in run_dirs if (got := _fold_submission(d)) is not None]
    if not found:
        raise SubmissionError(f"no finished run with a submission.csv among {len(run_dirs)} "
                              f"run folders ({run_dirs[0].parent if run_dirs else 'none given'})")
    config, first = found[0][1]
    id_column, target = config["csv_id_column"], config["csv_target"]
    for run_dir, (_, frame) in found[1:]:
        if list(frame.columns) != list(first.columns) or \
                frame[id_column].tolist() != first[id_column].tolist():
            raise SubmissionError(f"{run_dir / 'submission.csv'}: other ids or columns than "
                                  f"{found[0][0] / 'submission.csv'}; were the folds run on "
                                  "one test file?")
    values = pd.concat([frame[target].rename(i) for i, (_, (_, frame)) in enumerate(found)], axis=1)
    if config["csv_regression"]:
        combined = values.astype(float).mean(axis=1)
    else:
        classes = sorted(set(values.to_numpy().ravel().tolist()))
        counts = np.stack([(values == c).sum(axis=1).to_numpy() for c in classes], axis=1)
        combined = pd.Series([classes[i] for i in counts.argmax(axis=1)])
    out = pd.DataFrame({id_column: first[id_column], target: combined.to_numpy()})
    out.attrs["folds"] = [int(c["fold"]) for _, (c, _) in found]
    if out_path is None:
        out_path = run_dirs[0].parent.parent / "submissions" / f"{run_dirs[0].name}-folds.csv"
    kio.write_text(out_path, out.to_csv(index=False))
    out.attrs["path"] = str(out_path)
    return out
