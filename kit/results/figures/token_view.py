"""How the token views name what they show, without a model: a label by its name
(`label_name`: SST-2's "1" is positive) and the finished run a case study takes (`find_run`).
The views that run a checkpoint are kit.results.figures.model_scores."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from kit import runs
from kit.results.frame.collect import finished
from kit.config.tasks import Task

# Readable names for GLUE's numeric labels, in every view (label_name).
DISPLAY_LABELS = {"SST-2": {"0": "negative", "1": "positive"},
                  "CoLA": {"0": "unacceptable", "1": "acceptable"}}


def find_run(runs_df: pd.DataFrame, method: str, seed: int | None = None) -> Path:
    """The folder of a finished run of `method` (and `seed`) that kept its best checkpoint;
    the one with the highest dev score when several qualify."""
    ok = finished(runs_df, [method], seed)
    with_ckpt = ok[[runs.best_checkpoint(d) is not None for d in ok["run_dir"]]] if len(ok) else ok
    if with_ckpt.empty:
        why = ("none kept checkpoint/best: rerun with save_checkpoints: true" if len(ok)
               else "no finished run")
        raise ValueError(f"case study: {why} (method {method}"
                         + (f", seed {seed}" if seed is not None else "") + ")")
    return Path(with_ckpt.sort_values("score", ascending=False)["run_dir"].iloc[0])


def label_name(task: Task | None, value) -> str:
    """A label as every view shows it (the token views, dev predictions, the case study): a
    class by its name, SST-2's and CoLA's by meaning (DISPLAY_LABELS: SST-2's "1" is
    positive); a regression target to 2 decimals; without a registry task (a CSV run's tokens)
    the value as it is. `value`: a class index (the data's labels) or the class's name (what
    kit.predict predicts)."""
    if task is None:
        return str(value)
    if task.regression:
        return f"{float(value):.2f}"
    name = task.labels[int(value)] if isinstance(value, (int, np.integer)) else str(value)
    return DISPLAY_LABELS.get(task.name, {}).get(name, name)
