"""The tidy frames the paper's figures plot, from `kit.results.frame.collect.load_runs` frames and
the run folders' files (through kit.runs): gamma sensitivity (Fig. 7), training cost (Fig. 6) and
SSA label quality on the synthetic task; plus the method order, labels and seed text the figures
share. kit.results.figures.plots draws these frames; nothing here imports matplotlib or torch.
"""
from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
import pandas as pd

from kit import runs
from kit.results.frame.collect import finished
from kit.results.frame.no_runs import NoRuns
from kit.results.tables.build import METHOD_LABELS, score_scale

GAMMA_METHODS = ("bert-mask", "ssa-co", "ssa-h")
COST_METHODS = ("bert", "bert-mask", "ssa-h")
LABEL_METHODS = ("ssa-co", "ssa-h")


# ---------------------------------------------------------------- shared by the figures

def method_dtype(values) -> pd.CategoricalDtype:
    """Method names as an ordered categorical: the registry's methods in its order (the
    paper's rows), any other name after them by name. Sorting on it is the figures' order."""
    known = list(METHOD_LABELS)
    others = sorted({str(v) for v in pd.Series(values).dropna()} - set(known))
    return pd.CategoricalDtype([*known, *others], ordered=True)


def method_order(values) -> list:
    """The distinct methods of `values` in the figures' order (`method_dtype`)."""
    distinct = pd.Series(pd.unique(pd.Series(values)))
    return distinct.astype(method_dtype(distinct)).sort_values().astype(object).tolist()


def _in_method_order(column: pd.Series) -> pd.Series:
    """A sort_values key: the method column as `method_dtype`, other columns as they are."""
    return column.astype(method_dtype(column)) if column.name == "method" else column


def method_label(method: str) -> str:
    return METHOD_LABELS.get(method, str(method))


def seeds_text(runs: pd.DataFrame) -> str:
    """The seeds of a figure's runs for its title: "seeds 0-2", "seeds 0, 2, 5", "seed 1"."""
    seeds = sorted({int(s) for s in runs["seed"].dropna()})
    if len(seeds) == 1:
        return f"seed {seeds[0]}"
    if seeds == list(range(seeds[0], seeds[-1] + 1)):
        return f"seeds {seeds[0]}-{seeds[-1]}"
    return "seeds " + ", ".join(map(str, seeds))


def single(runs: pd.DataFrame, column: str, what: str) -> str:
    """The one value of `column` in `runs` (a figure shows one task, one model)."""
    values = sorted(map(str, runs[column].dropna().unique()))
    if len(values) != 1:
        raise ValueError(f"{what}: expected runs of one {column}, got "
                         f"{', '.join(values) if values else 'no runs'}; pick one with the "
                         f"{column} parameter")
    return values[0]


def one_per_device(runs: pd.DataFrame, what: str) -> None:
    """Refuse to mix runs timed alone with runs that shared their device (K points at once,
    --per-device): their wall clocks measure different things."""
    ks = sorted({int(k) for k in runs.get("per_device", pd.Series(dtype=float)).fillna(1)})
    if len(ks) > 1:
        raise ValueError(f"{what}: its runs were timed with {' and '.join(map(str, ks))} points "
                         "per device at once (--per-device): their wall clocks do not compare; "
                         "pick runs of one kind (a profile run alike)")


def _one_per_seed(runs: pd.DataFrame, keys: Sequence[str], what: str) -> None:
    dup = runs.duplicated([*keys, "seed"], keep=False)
    if dup.any():
        first = runs[dup].iloc[0]
        raise NoRuns(f"{what}: several finished runs for "
                     + ", ".join(f"{k}={first[k]}" for k in [*keys, "seed"])
                     + " (other hyper-parameters vary): filter the runs to one configuration")


# ---------------------------------------------------------------- Fig. 7: gamma sensitivity

def gamma_points(runs: pd.DataFrame, metric: str = "score",
                 methods: Sequence[str] = GAMMA_METHODS) -> pd.DataFrame:
    """Dev `metric` (best epoch, full dev set) per method x budget x gamma over the seeds of the
    finished runs: columns task, model, method, label, budget, gamma, mean, std (sample std;
    NaN with one seed), n, seeds, scale (the values are x100 where the task is shown x100). Runs
    of `budget: equal_steps` (BERT-mask at BERT-r's optimizer steps) are their own line,
    labelled "(equal steps)". One task and model; one configuration per line x gamma x seed."""
    ok = finished(runs, methods)
    if ok.empty:
        raise ValueError(f"gamma figure: no finished runs of {', '.join(methods)}")
    task, model = single(ok, "task", "gamma figure"), single(ok, "model", "gamma figure")
    if metric not in ok.columns:
        raise ValueError(f"gamma figure: no metric {metric!r} in the runs of {task}")
    ok = ok.assign(budget=ok["budget"].fillna("epochs") if "budget" in ok else "epochs")
    _one_per_seed(ok, ["method", "budget", "gamma"], "gamma figure")
    scale = score_scale(task, ok)
    stats = (ok.groupby(["method", "budget", "gamma"])[metric].agg(["mean", "std", "count"])
             .reset_index().rename(columns={"count": "n"}))
    stats["seeds"] = seeds_text(ok)
    stats[["mean", "std"]] *= scale
    stats.insert(0, "model", model)
    stats.insert(0, "task", task)
    stats.insert(3, "label", stats["method"].map(method_label) + stats["budget"].map(
        lambda b: "" if b == "epochs" else f" ({b.replace('_', ' ')})"))
    stats["scale"], stats["metric"] = scale, metric
    return (stats.sort_values(["method", "budget", "gamma"], key=_in_method_order)
            .reset_index(drop=True))


def gamma_baseline(runs: pd.DataFrame, metric: str = "score", baseline: str = "bert"
                   ) -> dict | None:
    """The baseline's dev `metric` over seeds as {method, label, mean, std, n} (scaled like
    `gamma_points`), or None without baseline runs. The baseline ignores gamma: runs of one seed
    that differ only in gamma (a grid that crosses every method with gamma) are one sample,
    their mean."""
    ok = finished(runs, [baseline])
    if ok.empty or metric not in ok.columns:
        return None
    task = single(ok, "task", "gamma baseline")
    per_seed = ok.groupby("seed")[metric].mean() * score_scale(task, ok)
    return {"method": baseline, "label": method_label(baseline), "mean": float(per_seed.mean()),
            "std": float(per_seed.std()) if len(per_seed) > 1 else float("nan"),
            "n": int(len(per_seed))}


# ---------------------------------------------------------------- Fig. 6: training cost

def load_history(run_dir: str | os.PathLike) -> pd.DataFrame:
    """A run's history.csv (one row per logging window: step, epoch, wall_s, loss terms, lr),
    or a one-line ValueError naming the file."""
    path = runs.history_path(run_dir)
    history = runs.read_history(run_dir)
    if history is None:
        raise ValueError(f"{path} not found: the run logged no training step")
    missing = {"step", "wall_s", "loss"} - set(history.columns)
    if missing:
        raise ValueError(f"{path}: no column(s) {', '.join(sorted(missing))}")
    return history


def cost_curves(runs: pd.DataFrame, methods: Sequence[str] = COST_METHODS,
                loss: str = "loss_target", seeds: Sequence[int] | None = None) -> pd.DataFrame:
    """Training loss against wall-clock time, one row per logged window of each finished run of
    `methods` at the default budget (epochs; equal_steps runs are left out): run_id, task,
    model, method, label, seed, step, epoch, wall_s, loss, log10_loss, loss_name.

    `loss` is a history.csv column: "loss_target" (default) is the target task's loss, the
    number that compares across methods ("loss" for methods without auxiliary terms); "loss" is
    the training objective (for SSA alpha * L_target + (1 - alpha) * L_SSA, as the paper plots
    it, and alpha * L_target alone before SSA starts); "loss_ssa" is NaN before
    ssa_start_epoch, where it was not computed (no zero line). wall_s counts from the start of
    training, label generation and evaluation included (the SSA delays in Fig. 6).
    log10_loss is NaN where the loss is not positive."""
    ok = finished(runs, methods)
    if "budget" in ok:                  # the runs as the paper trains them (not equal_steps)
        ok = ok[ok["budget"].fillna("epochs") == "epochs"]
    if seeds and len(ok):
        ok = ok[ok["seed"].isin(list(seeds))]
    if ok.empty:
        raise ValueError(f"cost figure: no finished runs of {', '.join(methods)}")
    single(ok, "task", "cost figure")
    one_per_device(ok, "cost figure")
    _one_per_seed(ok, ["method"], "cost figure")
    return pd.concat([_loss_curve(run, loss) for _, run in ok.iterrows()], ignore_index=True)


def _loss_curve(run: pd.Series, loss: str) -> pd.DataFrame:
    """One run's rows of `cost_curves`."""
    history = load_history(run["run_dir"])
    column = loss if loss in history.columns else "loss"
    if loss not in history.columns and loss != "loss_target":
        raise ValueError(f"{runs.history_path(run['run_dir'])}: no column {loss!r}")
    values = history[column].astype(float)
    if column == "loss_ssa" and "epoch" in history:   # logged before SSA started: no term
        start = run.get("ssa_start_epoch", 1)
        values = values.where(history["epoch"] > (1 if pd.isna(start) else start))
    return pd.DataFrame({
        "run_id": run["run_id"], "task": run["task"], "model": run.get("model"),
        "method": run["method"], "label": method_label(run["method"]),
        "seed": run["seed"], "step": history["step"],
        "epoch": history["epoch"] if "epoch" in history else np.nan,
        "wall_s": history["wall_s"].astype(float), "loss": values,
        "log10_loss": np.log10(values.where(values > 0)), "loss_name": loss})


def cost_summary(runs: pd.DataFrame, methods: Sequence[str] = COST_METHODS) -> pd.DataFrame:
    """Per finished run of `methods`: wall seconds in total, training, SSA label generation and
    evaluation, the best dev score, the last logged target-task loss (train_loss_target: the
    loss that compares across methods) and the label generation share of the total."""
    ok = finished(runs, methods)
    one_per_device(ok, "cost table")
    columns = ["wall_total_s", "wall_train_s", "wall_label_generation_s", "wall_eval_s",
               "score", "train_loss_target"]
    table = ok[["method", "seed", *[c for c in columns if c in ok.columns]]].copy()
    if {"wall_total_s", "wall_label_generation_s"} <= set(table.columns):
        table["label_generation_share"] = (table["wall_label_generation_s"]
                                           / table["wall_total_s"]).round(3)
    return table.sort_values(["method", "seed"], key=_in_method_order).reset_index(drop=True)


# ---------------------------------------------------------------- SSA label quality

_RUN_COLUMNS = ["run_id", "task", "model", "method", "label", "seed"]
_LABEL_STATS = ["cue_share_label1", "distractor_share_label1", "share_label1", "flip_rate",
                "probed", "kept", "variants", "labelled_tokens"]


def _label_stats(run: pd.Series) -> list[dict]:
    """metrics.json `ssa_labels` of a finished run: one dict per labelled epoch."""
    metrics = runs.read_metrics(run["run_dir"])
    if metrics is None:
        raise ValueError(f"{runs.metrics_path(run['run_dir'])}: not found (the run has not ended)")
    return metrics.get("ssa_labels") or []


def label_quality(runs: pd.DataFrame, methods: Sequence[str] = LABEL_METHODS) -> pd.DataFrame:
    """Per finished SSA run and labelled epoch (metrics.json `ssa_labels`): the share of label 1
    on the true cue tokens and on distractor tokens (synthetic tasks only: their token
    importance is known), with the epoch's probing counts. Columns: run_id, task, model,
    method, label, seed, epoch, cue_share_label1, distractor_share_label1, share_label1,
    flip_rate, probed, kept, variants, labelled_tokens. Epochs without cue statistics are left
    out."""
    ok = finished(runs, methods)
    records = [{**{k: run.get(k) for k in _RUN_COLUMNS if k != "label"},
                "label": method_label(run["method"]), "ssa_labels": _label_stats(run)}
               for _, run in ok.iterrows()]
    frame = (pd.json_normalize(records, "ssa_labels", _RUN_COLUMNS) if records
             else pd.DataFrame()).reindex(columns=[*_RUN_COLUMNS, "epoch", *_LABEL_STATS])
    frame = frame[frame["cue_share_label1"].notna() | frame["distractor_share_label1"].notna()]
    if frame.empty:
        raise NoRuns("label quality: no SSA label statistics with cue/distractor shares here; "
                     "they exist for ssa-co / ssa-h runs on the synthetic tasks, from epoch "
                     "ssa_start_epoch on (so epochs >= 2): `./run_all.sh` makes them")
    frame = frame.infer_objects().reset_index(drop=True)
    frame[_LABEL_STATS[:4]] = frame[_LABEL_STATS[:4]].astype(float)
    return frame
