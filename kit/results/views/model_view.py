"""The trained model in the notebook: its dev predictions as a frame (`dev_predictions`), the
errors it is surest of (`surest_errors`), a confusion matrix (`confusion`) or, for a regression
task, prediction against label (`plot_regression`).

Predictions come from the kit's own door, kit.predict.predict (the run's best checkpoint, the
dev set's tokenization and batching). A door sits above this layer
(docs/reference/architecture.md), so the notebook passes it in: `dev_predictions(run_dir, predict)`.
"""
from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np
import pandas as pd

from kit import runs
from kit.config.run_config import RunConfig
from kit.data.pipeline import load_task_data
from kit.results.figures.token_view import label_name

PROB = "prob_"       # the probability columns: prob_<class name, as label_name shows it>


def dev_predictions(run_dir: str | os.PathLike, predict: Callable, max_rows: int = 500
                    ) -> pd.DataFrame:
    """The first `max_rows` rows of the run's first dev split (kit.data.pipeline.load_task_data
    with the run's config: the rows it evaluated) with `predict(run_dir, texts)`'s output: the
    text column(s) by the task's names, `label`, `prediction` (classes by the name every view
    shows, token_view.label_name: SST-2's positive / negative), then for classes `confidence`
    (the predicted class's probability), `correct` and one prob_<class> per class, for
    regression `error` (prediction - label). attrs: task, split, regression, pair (a pair
    task), run_id. A sample to look at, bounded in time: the whole dev set's scores are in
    metrics.json."""
    config = runs.read_config(run_dir)
    if config is None:
        raise ValueError(f"{run_dir}: not a run folder (it has no config.json)")
    task, name, rows = dev_sample(config, max_rows)
    texts = rows.text_a if rows.text_b is None else list(zip(rows.text_a, rows.text_b))
    preds = predict(run_dir, texts).reset_index(drop=True)
    columns = list(task.text_columns)[:2 if rows.text_b is not None else 1]
    frame = pd.DataFrame(dict(zip(columns, [rows.text_a, rows.text_b])))
    regression = task.regression
    if regression:
        frame["label"], frame["prediction"] = rows.labels.astype(float), preds["prediction"]
        frame["error"] = frame["prediction"] - frame["label"]
    else:                                   # classes by the name every view shows
        frame["label"] = [label_name(task, int(y)) for y in rows.labels]
        frame["prediction"] = [label_name(task, str(p)) for p in preds["prediction"]]
        probs = preds[[c for c in preds.columns if c.startswith(PROB)]].rename(
            columns=lambda c: PROB + label_name(task, c[len(PROB):]))
        frame["confidence"] = probs.max(axis=1)
        frame["correct"] = frame["prediction"] == frame["label"]
        frame = pd.concat([frame, probs], axis=1)
    frame.attrs.update(task=task.name, split=name, regression=regression,
                       pair=rows.text_b is not None,
                       run_id=config.get("run_id", os.path.basename(str(run_dir))))
    return frame


def dev_sample(config: dict, n: int) -> tuple:
    """(task, the name of its first dev split, that split's first `n` rows) as the run of this
    config.json read them (kit.data.pipeline.load_task_data; fields the kit no longer has are
    left out)."""
    known = {k: v for k, v in config.items() if k in RunConfig.__dataclass_fields__}
    data = load_task_data(RunConfig.from_dict(known))
    name, split = next(iter(data.dev.items()))
    return data.task, name, split.subset(np.arange(min(n, len(split))))


def surest_errors(frame: pd.DataFrame, n: int = 10) -> pd.DataFrame:
    """The `n` wrong predictions the model was surest of, most confident first (rows in dev
    order where it was equally sure); for regression, the `n` largest |error|."""
    if "error" in frame.columns:
        order = frame["error"].abs().sort_values(ascending=False, kind="stable").index
        return frame.loc[order].head(n)
    wrong = frame[~frame["correct"]]
    return wrong.sort_values("confidence", ascending=False, kind="stable").head(n)


def confusion(frame: pd.DataFrame) -> pd.DataFrame:
    """Counts of label (rows) x prediction (columns), every class of the run on both axes
    (a class never predicted is a column of zeros), in the run's class order."""
    classes = [c[len(PROB):] for c in frame.columns if c.startswith(PROB)]
    return pd.crosstab(pd.Categorical(frame["label"], classes),
                       pd.Categorical(frame["prediction"], classes),
                       rownames=["label"], colnames=["prediction"], dropna=False)


def plot_regression(frame: pd.DataFrame, ax=None):
    """A regression run's dev predictions against their labels, with the line prediction =
    label; the title gives Pearson's r."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(4.5, 4.5))
    ax.scatter(frame["label"], frame["prediction"], s=10, alpha=0.6)
    low = float(min(frame["label"].min(), frame["prediction"].min()))
    high = float(max(frame["label"].max(), frame["prediction"].max()))
    ax.plot([low, high], [low, high], color="gray", linewidth=1)
    r = np.corrcoef(frame["label"], frame["prediction"])[0, 1] if len(frame) > 1 else np.nan
    ax.set_xlabel("label")
    ax.set_ylabel("prediction")
    ax.set_title(f"{frame.attrs.get('task', '')} {frame.attrs.get('split', 'dev')}: "
                 f"Pearson r = {r:.3f}")
    return ax
