"""Collect run folders into tables: load_runs / collect_runs, k-fold and out-of-fold tables,
hyper-parameter selection, the results notebook's table set, and writing md / csv / tex. The
summary and paper tables and their statistics are kit.tables (re-exported here).

Reads only what runs leave on disk (outputs/runs/<run_id>/config.json, metrics.json and
history.csv), never torch or the training code, so tables can be rebuilt anywhere from copied
run folders. Metric values in the run folders are fractions; `paper_table` shows them x100 like
the paper.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from kit import io as kio
from kit import runs
from kit.config import ConfigError, RunConfig
from kit.metrics import heldout_epoch
from kit.paper_results import PAPER_TASKS, paper_profile
from kit.profiles import load_profile, profile_path
# Re-exported: the tables' names callers know from kit.report (figures, notebooks, tests).
from kit.tables import (EPOCH_VIEWS, METHOD_LABELS, budget_view, comparisons,  # noqa: F401
                        epoch_table, epoch_view, fold_runs, paper_table, paper_table_for,
                        runs_table, score_scale, sorted_groups, summary_table)
from kit.tasks import csv_task

# Columns every frame from `load_runs` has, even when no run provided them.
_BASE_COLUMNS = ("run_id", "task", "model", "method", "seed", "status", "error", "score",
                 "best_epoch", "three_subset_mean", "three_subset_std")


# ---------------------------------------------------------------- collecting run folders

def _scalars(config: dict) -> dict:
    """config.json as flat scalar columns (nested keys joined with "."; lists are left out), so
    hyper-parameters such as lr, alpha, gamma can be grouped on."""
    flat = pd.json_normalize(config).to_dict("records")[0]
    return {k: v for k, v in flat.items() if v is None or isinstance(v, (str, int, float, bool))}


def _run_rows(run_dir: Path) -> list[dict]:
    """The run's row; a multi-task run (metrics `per_task`) gives one row per task instead, so
    EmBERT / Gated sit next to the single-task methods in every per-task table."""
    row = _run_row(run_dir)
    metrics = runs.read_metrics(run_dir) or {}
    per_task = metrics.get("per_task")
    if not per_task:
        return [row]
    three = metrics.get("per_task_three_subset") or {}
    shared = {k: v for k, v in row.items() if "/" not in k}
    return [{**shared, "task": name, **values, "multitask_run": row["run_id"],
             "three_subset_mean": three.get(name, {}).get("mean"),
             "three_subset_std": three.get(name, {}).get("std")}
            for name, values in per_task.items()]


def _run_row(run_dir: Path) -> dict:
    """One table row from one run folder (see `load_runs`)."""
    metrics_path = run_dir / "metrics.json"
    config = runs.read_config(run_dir) or {}
    metrics = runs.read_metrics(run_dir)
    if metrics is not None:
        if metrics.get("status") not in ("ok", "failed"):
            raise ValueError(f"{metrics_path}: status must be 'ok' or 'failed', "
                             f"got {metrics.get('status')!r}")
        if metrics["status"] == "ok" and "score" not in (metrics.get("best_dev") or {}):
            raise ValueError(f"{metrics_path}: an ok run needs best_dev with a score")
    else:
        metrics = {"status": "missing", "error": "no metrics.json: still running or killed"}
    row = {"run_id": run_dir.name}
    # A failed run may stop writing after `error`: its identity then comes from config.json.
    for key in ("run_id", "task", "model", "method", "seed"):
        value = metrics.get(key, config.get(key))
        if value is not None:
            row[key] = value
    row.update(status=metrics["status"], error=metrics.get("error"))
    row.update(metrics.get("best_dev") or {})
    three = metrics.get("best_three_subset") or {}
    row.update(best_epoch=metrics.get("best_epoch"), three_subset_mean=three.get("mean"),
               three_subset_std=three.get("std"))
    row.update({f"wall_{part}_s": secs for part, secs in (metrics.get("wall_s") or {}).items()})
    row.update(train_examples_per_s=metrics.get("train_examples_per_s"),
               peak_memory_mb=metrics.get("peak_memory_mb"))
    row.update({f"last_{k}": v for k, v in (metrics.get("last_dev") or {}).items()})
    subsets = [e["three_subset"]["subsets"] for e in metrics.get("epochs") or []
               if len((e.get("three_subset") or {}).get("subsets") or []) == 3]
    if subsets and len(subsets) == len(metrics["epochs"]):
        row["heldout_epoch"], row["heldout_score"] = heldout_epoch(subsets)
    row["train_loss_target"] = _last_target_loss(run_dir)
    for key, value in _scalars(config).items():
        row.setdefault(key, value)              # what metrics.json says wins over the config
    row["run_dir"] = str(run_dir)
    return row


def _last_target_loss(run_dir: Path) -> float | None:
    """The target-task loss of the run's last logged window (history.csv `loss_target`, or
    `loss` where the method adds no term): comparable across methods, unlike `loss`, which for
    SSA is alpha * L_target + (1 - alpha) * L_SSA (and alpha * L_target before SSA starts)."""
    history = runs.read_history(run_dir)
    if history is None:
        return None
    last = history.iloc[-1:]
    column = "loss_target" if "loss_target" in last.columns else "loss"
    return float(last[column].iloc[0]) if len(last) and column in last.columns else None


def load_runs(run_dirs: str | os.PathLike | Iterable[str | os.PathLike]) -> pd.DataFrame:
    """One row per run folder: identity, status, best-dev metrics, selection stats, costs, config.

    `run_dirs` is either the runs root (outputs/runs: every non-hidden sub-folder is a run) or an
    iterable of run folders. Columns: run_id, task, model, method, seed, status, error, each
    best_dev metric under its own name (accuracy, f1, accuracy_mm, score ...), best_epoch,
    three_subset_mean/std, wall_<part>_s, train_examples_per_s, peak_memory_mb, the last
    epoch's dev metrics as last_<name>, heldout_epoch / heldout_score (the epoch chosen on dev
    subset 1, its score on subsets 2-3: `kit.metrics.heldout_epoch`), train_loss_target (the
    last logged target-task loss, comparable across methods), then the
    config's scalar entries (lr, batch_size, epochs, alpha, beta, gamma ...), and run_dir.

    Failed runs are rows with status "failed" (their metric columns are NaN). A folder without
    metrics.json is a row with status "missing" rather than skipped: a grid's missing seeds then
    show up in the tables' counts instead of silently shrinking n. A corrupt JSON file raises a
    ValueError naming the file: such a file is not something a finished run writes (the loop
    writes metrics.json atomically), so it needs a look rather than a guess.
    """
    if isinstance(run_dirs, (str, os.PathLike)):
        root = Path(run_dirs)
        run_dirs = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    df = pd.DataFrame([row for d in run_dirs for row in _run_rows(Path(d))])
    for column in _BASE_COLUMNS:
        if column not in df.columns:
            df[column] = np.nan
    return df


def profile_run_dirs(profile: str, outputs_dir: str | os.PathLike = "outputs") -> list[Path] | None:
    """The run folders of a profile's grid that exist under `outputs_dir`, or None when
    `profile` is no profile file (a name in params/ or a YAML path).

    Membership is by run id, as the batch runner's own tables do: a finished run is shared by
    every profile whose grid holds its config (the second profile skips it), while its
    config.json names only the profile that ran it first."""
    try:
        profile_path(profile)
    except ConfigError:
        return None
    points = load_profile(profile, str(outputs_dir)).points
    ids = dict.fromkeys(RunConfig.from_dict(p).run_id for p in points)
    dirs = [Path(outputs_dir) / "runs" / run_id for run_id in ids]
    return [d for d in dirs if (d / "config.json").exists() or (d / "metrics.json").exists()]


def collect_runs(outputs_dir: str | os.PathLike = "outputs", profile: str | None = None,
                 **where) -> pd.DataFrame:
    """`load_runs` over `<outputs_dir>/runs`, optionally one profile's runs and exact-match
    filters on any column (`task="SST-2"`, `model="minilm"`; None and "" are ignored).

    `profile` is a profile name in params/ or a YAML path: its grid's runs (by run id, see
    `profile_run_dirs`); any other string matches config.json's `profile` field. An empty
    frame (with the base columns) when nothing matches."""
    root = Path(outputs_dir) / "runs"
    dirs = profile_run_dirs(profile, outputs_dir) if profile else None
    by_field = dirs is None and bool(profile)
    if dirs is None:
        dirs = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")) \
            if root.is_dir() else []
    df = load_runs(dirs)
    if by_field:
        df = df[df["profile"] == profile] if "profile" in df.columns else df.iloc[:0]
    for column, value in where.items():
        if value is not None and value != "":
            if column not in df.columns:
                if df.empty:
                    continue
                raise ValueError(f"no column {column!r} to filter on: runs have "
                                 f"{', '.join(map(str, df.columns))}")
            df = df[df[column] == value]
    return df.reset_index(drop=True)


# ---------------------------------------------------------------- k-fold CSV runs

# Metric columns a fold table shows, in this order, when the runs have them (regression CSV
# tasks: rmse, mse, pearson, spearman; classification: accuracy, f1, f1_macro).
_FOLD_METRICS = ("rmse", "mse", "pearson", "spearman", "accuracy", "f1", "f1_macro", "mcc")
_FOLD_KEYS = ("task", "model", "method", "seed")


def fold_table(df: pd.DataFrame, by: Sequence[str] = ()) -> pd.DataFrame:
    """Per task x model x method x seed (x the `by` columns): one row per fold run (its fold,
    status, best-dev metrics, best epoch, run id), then a row "mean ± std" over the OK folds
    (sample std; "n=ok/k" says how many of the k folds finished). Regression CSV tasks show
    rmse, mse, pearson, spearman (rmse/mse in the target's units); classification ones accuracy
    and F1. Several OK runs for one fold of a group mean mixed configurations: pass the
    hyper-parameters that differ as `by`."""
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
                         "best_epoch": run["best_epoch"], "run_id": run["run_id"]})
        n_folds = int(pd.to_numeric(group["n_folds"]).max())
        rows.append({**named, "fold": f"mean ± std (n={len(ok)}/{n_folds})", "status": "",
                     **{m: f"{ok[m].mean():.4f} ± {ok[m].std():.4f}" if len(ok) > 1
                        else (f"{ok[m].mean():.4f}" if len(ok) else "") for m in metrics},
                     "best_epoch": "", "run_id": ""})
    return pd.DataFrame(rows, columns=[*keys, "fold", "status", *metrics, "best_epoch", "run_id"])


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
    return [Path(cfg.outputs_dir) / "runs" / dataclasses.replace(cfg, fold=f).run_id
            for f in range(cfg.n_folds)]


def oof_predictions(run_dirs: str | os.PathLike | Iterable[str | os.PathLike],
                    columns: Sequence[str] = (), epoch: int | None = None) -> pd.DataFrame:
    """Out-of-fold predictions: the dev predictions of every finished k-fold run, one row per
    CSV row and configuration: predictions/dev.tsv (the best epoch), or with `epoch` N
    predictions/dev_epoch<N>.tsv (runs that save every epoch's predictions). Columns:
    config_key (the config without its fold: one k-fold set), task, model, method, seed, the config fields in
    `columns`, n_folds, fold, run_id, index (the CSV's id or row number), prediction, label
    (floats for regression, label strings for classification).

    Runs that are not k-fold runs or did not end ok are left out. A CSV row in the dev
    predictions of two folds of one set (mixed fold assignments) is a ValueError. Note that
    best-epoch predictions are chosen on the fold itself (the usual Kaggle habit), so OOF
    scores are slightly optimistic next to a fixed epoch count (`epoch`).
    """
    if isinstance(run_dirs, (str, os.PathLike)):
        root = Path(run_dirs)
        run_dirs = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    frames = []
    for run_dir in map(Path, run_dirs):
        config, metrics = runs.read_config(run_dir), runs.read_metrics(run_dir)
        if config is None or metrics is None:
            continue
        if int(config.get("n_folds") or 0) < 2 or metrics.get("status") != "ok":
            continue
        path = run_dir / "predictions" / ("dev.tsv" if epoch is None else f"dev_epoch{epoch}.tsv")
        if not path.exists():
            raise ValueError(f"{path}: a finished k-fold run without these dev predictions")
        pred = pd.read_csv(path, sep="\t", dtype=str, keep_default_na=False, quoting=3)
        if config.get("csv_regression", True):
            pred[["prediction", "label"]] = pred[["prediction", "label"]].astype(float)
        ident = {"config_key": fold_set_key(config),
                 **{k: config.get(k) for k in (*_FOLD_KEYS, *columns)},
                 "n_folds": int(config["n_folds"]), "fold": int(config.get("fold", 0)),
                 "run_id": run_dir.name}
        frames.append(pred.assign(**ident)[[*ident, "index", "prediction", "label"]])
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
    rows, folds present of n_folds, complete (every fold present), then kit.metrics for a CSV
    task: rmse, mse, pearson, spearman (regression) or accuracy, F1 (classification)."""
    from kit.metrics import compute_metrics
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


def profile_tables(runs: pd.DataFrame, varying: Sequence[str] = ()) -> dict[str, pd.DataFrame]:
    """The tables of one profile's runs, for write_tables. `varying`: the grid axes with more
    than one value. Axes other than task/model/method/seed/fold are grouped on (so e.g.
    guide_loss task vs task+both are two summary rows, not two runs of one seed), unless they
    do not change results (glue_dir, outputs_dir ...) or only vary between tasks. A fold axis
    gives the per-fold table (mean ± std over folds) and the out-of-fold table instead of the
    over-seeds summary. The paper layout is added when the grid varies only task / method /
    seed / model and has the bert baseline."""
    fixed = {"task", "model", "method", "seed", "fold", *RunConfig._NOT_IDENTITY}
    # a knob set per task (task_overrides, e.g. beta) is part of the task, not a grouping axis
    by = [k for k in varying if k not in fixed and k in runs.columns
          and runs.groupby("task", dropna=False)[k].nunique(dropna=False).max() > 1]
    ok = runs[runs["status"] == "ok"]
    tables: dict[str, pd.DataFrame] = {}
    if len(ok) and "bert" in set(ok["method"]) and not by and "fold" not in varying:
        tables["Paper layout (Table 2)"] = paper_table(runs)
    if len(fold_runs(runs)) and ("fold" in varying or runs["fold"].nunique() > 1):
        tables["Folds (per fold; mean ± std over folds)"] = fold_table(runs, by)
        oof = oof_predictions(runs["run_dir"], columns=by)
        if len(oof):
            tables["Out-of-fold (all folds' dev predictions together)"] = oof_metrics(oof, by)
    else:
        tables["Summary (mean ± std over seeds)"] = summary_table(runs, by)
    tables["Runs"] = runs_table(runs)
    return tables


# ---------------------------------------------------------------- model selection

def _select(df: pd.DataFrame, group_keys: Sequence[str], candidate_keys: Sequence[str],
            criterion: pd.Series) -> pd.DataFrame:
    """All runs (every seed, any status) of the candidate configuration with the highest
    criterion (averaged over its OK seeds) in each group. Ties go to the first candidate in
    sorted order, so the choice is deterministic."""
    keys = [*group_keys, *candidate_keys]
    ok = df["status"] == "ok"
    per_candidate = (df[ok].assign(selection_criterion=criterion[ok])
                     .groupby(keys, dropna=False)["selection_criterion"].mean().reset_index())
    best = (per_candidate.sort_values(keys).sort_values("selection_criterion", ascending=False,
                                                         kind="stable")
            .groupby(list(group_keys), dropna=False).head(1))
    return df.merge(best, on=keys, how="inner")


def select_by_three_subsets(df: pd.DataFrame, group_keys: Sequence[str],
                            candidate_keys: Sequence[str]) -> pd.DataFrame:
    """The paper's section 4.3 rule: per group (e.g. task x model x method), the candidate
    hyper-parameters (e.g. lr, batch_size, epochs, alpha, beta, gamma) with "high average
    performance with the smallest variance on the three validation subsets".

    We read that as maximising three_subset_mean - three_subset_std (one number trading the two
    off, in the score's own units), averaged over the candidate's seeds. Returns the chosen
    candidates' runs with a `selection_criterion` column, ready for summary_table/paper_table.
    """
    criterion = df["three_subset_mean"] - df["three_subset_std"]
    return _select(df, group_keys, candidate_keys, criterion)


def select_by_best_dev(df: pd.DataFrame, group_keys: Sequence[str],
                       candidate_keys: Sequence[str]) -> pd.DataFrame:
    """Plain selection for comparison: the candidate with the highest mean best-dev score."""
    return _select(df, group_keys, candidate_keys, df["score"])


# Hyper-parameters a grid may vary (the paper's section 4.3 grid and the SSA knobs).
HYPERPARAMETERS = ("lr", "batch_size", "epochs", "alpha", "beta", "gamma", "warmup_ratio",
                   "weight_decay", "max_length", "max_train_examples", "mask_ratio",
                   "mask_scheme", "label_rule", "label_merge", "hybrid_weighting",
                   "attention_threshold", "ssa_start_epoch", "layer_decay", "guide_loss")
SELECTION_RULES = ("three_subset", "best_dev", "none")


def varying_hyperparameters(df: pd.DataFrame,
                            group_keys: Sequence[str] = ("task", "model", "method")) -> list[str]:
    """The HYPERPARAMETERS columns that take several values inside some group: the candidate
    keys a selection rule chooses among."""
    present = [k for k in HYPERPARAMETERS if k in df.columns]
    if df.empty or not present:
        return []
    counts = df.groupby(list(group_keys), dropna=False)[present].nunique(dropna=False)
    return [k for k in present if (counts[k] > 1).any()]


def select_runs(df: pd.DataFrame, rule: str = "three_subset",
                group_keys: Sequence[str] = ("task", "model", "method"),
                candidate_keys: Sequence[str] | None = None) -> pd.DataFrame:
    """One configuration per group, ready for paper_table/summary_table: `rule` three_subset
    (the paper's section 4.3 rule, `select_by_three_subsets`), best_dev
    (`select_by_best_dev`) or none (the runs as they are). `candidate_keys` default to the
    hyper-parameters that vary (`varying_hyperparameters`); with none varying every rule
    returns the runs unchanged."""
    if rule not in SELECTION_RULES:
        raise ValueError(f"unknown selection rule {rule!r}: choose one of {SELECTION_RULES}")
    keys = list(varying_hyperparameters(df, group_keys) if candidate_keys is None
                else candidate_keys)
    if rule == "none" or not keys or df.empty:
        return df
    select = select_by_three_subsets if rule == "three_subset" else select_by_best_dev
    return select(df, list(group_keys), keys)


def _configuration(row: pd.Series, keys: Sequence[str]) -> str:
    return " ".join(f"{k}={row[k]:g}" if isinstance(row[k], float) else f"{k}={row[k]}"
                    for k in keys)


def selection_table(df: pd.DataFrame, group_keys: Sequence[str] = ("task", "model", "method"),
                    candidate_keys: Sequence[str] | None = None) -> pd.DataFrame:
    """The paper's three-subset rule next to plain best-dev selection, per group: the
    configuration each picks, its mean best-dev score over seeds (x100 where the task is
    shown x100), its three-subset mean - std criterion, and whether the two rules agree.
    Empty when no hyper-parameter varies (nothing to select)."""
    keys = list(varying_hyperparameters(df, group_keys) if candidate_keys is None
                else candidate_keys)
    if not keys or df.empty:
        return pd.DataFrame(columns=[*group_keys, "candidates"])
    picks = {rule: select_runs(df, rule, group_keys, keys)
             for rule in ("three_subset", "best_dev")}
    rows = []
    for key, group in sorted_groups(df, list(group_keys)):
        named = dict(zip(group_keys, key))
        scale = score_scale(named.get("task", ""), group)
        ok = group[group["status"] == "ok"]
        row = {**named, "candidates": len(ok.drop_duplicates(keys))}
        chosen = {}
        for rule, picked in picks.items():
            mine = picked.merge(pd.DataFrame([named]), on=list(group_keys))
            mine = mine[mine["status"] == "ok"]
            if mine.empty:
                row.update({f"{rule}_config": "", f"{rule}_score": np.nan})
                continue
            chosen[rule] = _configuration(mine.iloc[0], keys)
            criterion = mine["three_subset_mean"] - mine["three_subset_std"]
            row.update({f"{rule}_config": chosen[rule],
                        f"{rule}_score": round(mine["score"].mean() * scale, 2),
                        f"{rule}_criterion": round(criterion.mean() * scale, 2),
                        f"{rule}_seeds": len(mine)})
        row["same"] = len(set(chosen.values())) == 1 and len(chosen) == 2
        rows.append(row)
    return pd.DataFrame(rows)


def results_tables(df: pd.DataFrame, paper: str | None = "auto", rule: str = "three_subset",
                   baseline: str = "bert", candidate_keys: Sequence[str] | None = None,
                   test: str = "welch", epoch: str = "best", profile: str | None = None
                   ) -> dict[str, pd.DataFrame]:
    """The tables of notebooks/results.ipynb from collected runs, of the configuration `rule`
    selects per task x model x method: the paper's layout in the `epoch` view (EPOCH_VIEWS),
    marks from `test` (welch / permutation) Holm-corrected across the table; the comparisons
    behind the marks (p and Holm p); the summary over seeds; the task score in every epoch view;
    with runs of budget equal_steps, the paper layout at equal optimizer steps too; and, when
    hyper-parameters vary, the selection table. Each table's caption is in `.attrs`.

    `paper`: "auto" adds the paper's rows (and measured - paper deltas) only for the paper's
    profiles (kit.paper_results.PAPER_PROFILES), a table name ("base" ...) always, "" never.
    Ready for `write_tables`."""
    ok = df[df["status"] == "ok"] if len(df) else df
    if ok.empty:
        raise ValueError("no finished (status ok) runs to tabulate: run the profile first "
                         "(./run_all.sh PROFILE) or check outputs_dir / profile")
    selected = select_runs(df, rule, candidate_keys=candidate_keys)
    if "budget" in selected.columns:       # runs from before the budget knob trained "epochs"
        selected = selected.assign(budget=selected["budget"].fillna("epochs"))
    if not set(ok["task"]) & set(PAPER_TASKS) or (paper == "auto" and not paper_profile(profile)):
        paper = None                    # no task of the paper's tables, or not a paper profile
    budgets = sorted(set(selected.get("budget", pd.Series(dtype=str)).dropna()) - {"epochs"})
    runs = budget_view(selected, "epochs")
    options = dict(baseline=baseline, test=test, epoch=epoch)
    tables = {"Paper layout": paper_table(runs, paper=paper or None, **options),
              "Comparisons": comparisons(epoch_view(runs, epoch), baseline, test)}
    for budget in budgets:
        tables[f"Paper layout ({budget.replace('_', ' ')})"] = paper_table(
            budget_view(selected, budget), **options)
    by = ["budget"] if budgets else []
    tables["Summary over seeds"] = summary_table(selected, by)
    tables["Epoch selection"] = epoch_table(runs)
    selection = selection_table(df, candidate_keys=candidate_keys)
    if len(selection):
        tables["Model selection"] = selection
    return tables


# ---------------------------------------------------------------- writing

def _markdown_cell(value) -> str:
    """A table value as markdown text: blank when missing, floats to 6 significant digits,
    "|" escaped (it would split the cell)."""
    if pd.isna(value):
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def _markdown(frame: pd.DataFrame) -> str:
    """A GitHub markdown table (pandas' to_markdown; cells pre-formatted, never re-parsed)."""
    text = frame.map(_markdown_cell).rename(columns=str)
    return text.to_markdown(index=False, tablefmt="github", disable_numparse=True) + "\n"


def _with_index(table: pd.DataFrame) -> pd.DataFrame:
    """The table with a named index (paper_table's "Model") as its first column; an unnamed
    index is only row numbers and is dropped."""
    named = any(name is not None for name in table.index.names)
    return table.reset_index(drop=not named)


def _tex_text(text: str) -> str:
    """Plain text (a caption) made safe for LaTeX: its special characters escaped."""
    for char in "&%$#_{}":
        text = text.replace(char, "\\" + char)
    return text.replace("<", "$<$")


def _slug(text: str) -> str:
    """A file-name and LaTeX-label friendly form of a table title."""
    return "-".join("".join(c if c.isalnum() else " " for c in text.lower()).split())


def write_tables(tables: pd.DataFrame | Mapping[str, pd.DataFrame], name: str,
                 tables_dir: str | os.PathLike) -> list[Path]:
    """Write `<name>.md`, one CSV per table and `<name>.tex` under `tables_dir`, each
    atomically (kit.io: a crash leaves the old file or the new one, never half of one).

    `tables` is one table (`<name>.csv`), or {title: table} for several in one file set (a
    profile's summary, paper table and selection): md gets a "## title" section per table, csv
    a file per table, `<name>-<title slug>.csv` (tables of different shapes are never stacked),
    tex a booktabs table per table with a caption (the title and the table's
    `attrs["caption"]`, which md prints under the table) and a label `tab:<name>-<title slug>`.
    All texts are built before anything is written, so a formatting error leaves the old files
    untouched.
    """
    named = {name: tables} if isinstance(tables, pd.DataFrame) else dict(tables)
    several = not isinstance(tables, pd.DataFrame)
    captions = {title: t.attrs.get("caption", "") for title, t in named.items()}
    frames = {title: _with_index(t) for title, t in named.items()}
    md = "\n".join((f"## {title}\n\n" if several else "") + _markdown(f)
                   + (f"\n{captions[title]}\n" if captions[title] else "")
                   for title, f in frames.items())
    csvs = {(f"{name}-{_slug(title)}" if several else name): f.to_csv(index=False)
            for title, f in frames.items()}
    tex = "\n".join(f.to_latex(index=False, escape=True, na_rep="", float_format="{:.6g}".format,
                               caption=_tex_text(" ".join(filter(None, [title + ".",
                                                                         captions[title]]))),
                               label=f"tab:{_slug(name)}" + (f"-{_slug(title)}" if several else ""))
                    for title, f in frames.items()
                    ).replace("±", r"$\pm$").replace("†", r"$\dagger$")   # robust in any TeX
    texts = {Path(tables_dir) / f"{name}.md": md,
             **{Path(tables_dir) / f"{stem}.csv": text for stem, text in csvs.items()},
             Path(tables_dir) / f"{name}.tex": tex}
    for path, text in texts.items():
        kio.write_text(path, text)            # tmp file beside it, then os.replace
    return list(texts)


def write_results(tables: pd.DataFrame | Mapping[str, pd.DataFrame],
                  outputs_dir: str | os.PathLike = "outputs", profile: str | None = None,
                  name: str = "") -> list[Path]:
    """`write_tables` into `<outputs_dir>/tables/` as `name`, by default `<profile>-results`
    (`all-results` without a profile; a YAML path's stem), beside the batch runner's own
    `<profile>.{md,csv,tex}`."""
    stem = Path(profile).stem if profile and profile.endswith((".yaml", ".yml")) else profile
    return write_tables(tables, name or f"{stem or 'all'}-results", Path(outputs_dir) / "tables")
