"""k-fold CSV runs: the per-fold table (mean ± std over folds), the runs of one k-fold set,
and out-of-fold predictions and their metrics (the Kaggle habit: every row scored once, by the
model that did not train on it). Reads run folders through kit.runs only."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import pandas as pd

from kit import runs
from kit.config.run_config import RunConfig
from kit.train.metrics import compute_metrics
from kit.results.tables.build import fold_runs, sorted_groups
from kit.config.tasks import csv_task
from kit.train.progress import epoch_number

# Metric columns a fold table shows, in this order, when the runs have them (regression CSV
# tasks: rmse, mse, pearson, spearman; classification: accuracy, f1, f1_macro).
_FOLD_METRICS = ("rmse", "mse", "pearson", "spearman", "accuracy", "f1", "f1_macro", "mcc")
_FOLD_KEYS = ("task", "model", "method", "seed")


def fold_table(df: pd.DataFrame, by: Sequence[str] = ()) -> pd.DataFrame:
    """Per task x model x method x seed (x the `by` columns): one row per fold run (its fold,
    status, best-dev metrics, best epoch counted from 1, run id), then a row "mean ± std" over
    the OK folds (sample std; "n=ok/k" says how many of the k folds finished). Regression CSV
    tasks show rmse, mse, pearson, spearman (rmse/mse in the target's units); classification
    ones accuracy and F1. Several OK runs for one fold of a group mean mixed configurations:
    pass the hyper-parameters that differ as `by`."""
    df = fold_runs(df)
    keys = [*_FOLD_KEYS, *by]
    metrics = [m for m in _FOLD_METRICS if m in df.columns and df[m].notna().any()]
    rows = []
    for key, group in sorted_groups(df, keys):
        named = dict(zip(keys, key))
        ok = group[group["status"] == "ok"]
        if ok["fold"].duplicated().any():
            raise ValueError(f"{'/'.join(map(str, key))}: several OK runs for one fold; group by "
                             "the hyper-parameters that differ (by=[...])")
        for _, run in group.sort_values("fold").iterrows():
            rows.append({**named, "fold": str(int(run["fold"])), "status": run["status"],
                         **{m: round(float(run[m]), 4) for m in metrics},
                         "best_epoch": _shown(run["best_epoch"]), "run_id": run["run_id"]})
        n_folds = int(pd.to_numeric(group["n_folds"]).max())
        rows.append({**named, "fold": f"mean ± std (n={len(ok)}/{n_folds})", "status": "",
                     **{m: f"{ok[m].mean():.4f} ± {ok[m].std():.4f}" if len(ok) > 1
                        else (f"{ok[m].mean():.4f}" if len(ok) else "") for m in metrics},
                     "best_epoch": "", "run_id": ""})
    return pd.DataFrame(rows, columns=[*keys, "fold", "status", *metrics, "best_epoch", "run_id"])


def _shown(best_epoch) -> int | None:
    """A run's best epoch as a reader counts it (from 1); None for a run without one."""
    return None if pd.isna(best_epoch) else int(epoch_number(best_epoch))


def fold_set_key(config: dict | RunConfig) -> str:
    """One id for the runs of a k-fold set: the config minus the fold (and the fields that do
    not change results), so the k runs of one configuration share it."""
    if isinstance(config, RunConfig):
        config = json.loads(json.dumps(config.to_dict()))      # as config.json holds it
    skip = {"fold", "run_id", *RunConfig._NOT_IDENTITY}
    kept = {k: v for k, v in sorted(config.items()) if k not in skip}
    return hashlib.sha1(json.dumps(kept, sort_keys=True).encode()).hexdigest()[:10]


def fold_run_dirs(cfg: RunConfig) -> list[Path]:
    """The run folders of all k folds of `cfg`'s k-fold set (folds 0..n_folds-1; they exist
    once a fold has started), under cfg.outputs_dir/runs as the training loop names them."""
    if cfg.n_folds < 2:
        raise ValueError(f"{cfg.run_id} is not a k-fold run (n_folds={cfg.n_folds})")
    return [runs.run_dir_of(dataclasses.replace(cfg, fold=f)) for f in range(cfg.n_folds)]


def _fold_predictions(run_dir: Path, columns: Sequence[str], epoch: int | None
                      ) -> pd.DataFrame | None:
    """One finished k-fold run's dev predictions with the run's identity columns, or None for
    a run that is no k-fold run or did not end ok."""
    config, metrics = runs.read_config(run_dir), runs.read_metrics(run_dir)
    if config is None or metrics is None:
        return None
    if int(config.get("n_folds") or 0) < 2 or metrics.get("status") != "ok":
        return None
    pred = runs.read_dev_predictions(run_dir, epoch)
    if pred is None:
        raise ValueError(f"{runs.dev_predictions_path(run_dir, epoch)}: a finished k-fold run "
                         "without these dev predictions")
    if config.get("csv_regression", True):
        pred[["prediction", "label"]] = pred[["prediction", "label"]].astype(float)
    ident = {"config_key": fold_set_key(config),
             **{k: config.get(k) for k in (*_FOLD_KEYS, *columns)},
             "n_folds": int(config["n_folds"]), "fold": int(config.get("fold", 0)),
             "run_id": run_dir.name}
    return pred.assign(**ident)[[*ident, "index", "prediction", "label"]]


def oof_predictions(run_dirs: str | os.PathLike | Iterable[str | os.PathLike],
                    columns: Sequence[str] = (), epoch: int | None = None) -> pd.DataFrame:
    """Out-of-fold predictions: the dev predictions of every finished k-fold run, one row per
    CSV row and configuration: predictions/dev.tsv (the best epoch), or with `epoch` N
    predictions/dev_epoch<N>.tsv (runs that save every epoch's predictions). Columns:
    config_key (the config without its fold: one k-fold set), task, model, method, seed, the
    config fields in `columns`, n_folds, fold, run_id, index (the CSV's id or row number),
    prediction, label (floats for regression, label strings for classification).

    Runs that are not k-fold runs or did not end ok are left out. A CSV row in the dev
    predictions of two folds of one set (mixed fold assignments) is a ValueError. Note that
    best-epoch predictions are chosen on the fold itself (the usual Kaggle habit), so OOF
    scores are slightly optimistic next to a fixed epoch count (`epoch`).
    """
    if isinstance(run_dirs, (str, os.PathLike)):
        run_dirs = runs.run_folders(run_dirs)
    frames = [f for f in (_fold_predictions(Path(d), columns, epoch) for d in run_dirs)
              if f is not None]
    names = ["config_key", *_FOLD_KEYS, *columns, "n_folds", "fold", "run_id", "index",
             "prediction", "label"]
    if not frames:
        return pd.DataFrame(columns=names)
    oof = pd.concat(frames, ignore_index=True)[names]
    twice = oof.duplicated(["config_key", "index"], keep=False)
    if twice.any():
        first = oof[twice].iloc[0]
        folds = sorted(oof[twice & (oof["index"] == first["index"])
                           & (oof["config_key"] == first["config_key"])]["fold"])
        raise ValueError(f"row {first['index']!r} is in the dev predictions of folds {folds} of "
                         f"one configuration ({first['run_id']} ...): the runs mix fold "
                         "assignments")
    return oof.sort_values(["config_key", "fold", "index"], kind="stable").reset_index(drop=True)


def oof_metrics(oof: pd.DataFrame, columns: Sequence[str] = ()) -> pd.DataFrame:
    """Metrics over all out-of-fold predictions of each k-fold set (one row per config_key):
    rows, folds present of n_folds, complete (every fold present), then kit.train.metrics for a CSV
    task: rmse, mse, pearson, spearman (regression) or accuracy, F1 (classification)."""
    rows = []
    for key, group in oof.groupby("config_key", sort=False):
        regression = pd.api.types.is_float_dtype(group["prediction"])
        if regression:
            task = csv_task(("text",), None)
            preds, gold = group["prediction"].to_numpy(), group["label"].to_numpy()
        else:
            labels = tuple(sorted(set(group["label"]) | set(group["prediction"])))
            task = csv_task(("text",), labels)
            preds = group["prediction"].map(labels.index).to_numpy()
            gold = group["label"].map(labels.index).to_numpy()
        first = group.iloc[0]
        n_folds, present = int(first["n_folds"]), group["fold"].nunique()
        metrics = compute_metrics(task, preds, gold)
        metrics.pop("score")
        rows.append({**{k: first[k] for k in (*_FOLD_KEYS, *columns)}, "config_key": key,
                     "rows": len(group), "folds": f"{present}/{n_folds}",
                     "complete": present == n_folds, **metrics})
    return pd.DataFrame(rows)
