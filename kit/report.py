"""Collect run folders into tables: summaries over seeds, the paper's Table 2 layout, selection.

Reads only what runs leave on disk (outputs/runs/<run_id>/config.json and metrics.json), never
torch or the training code, so tables can be rebuilt anywhere from copied run folders. Metric
values in the run folders are fractions; `paper_table` shows them x100 like the paper.
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
from kit.config import RunConfig
from kit.metrics import reported_metrics, significance_mark, welch_test
from kit.paper_results import PAPER_TASKS, PaperRow, paper_row
from kit.tasks import GLUE_TASKS, csv_task, get_task

# Row order and labels of the paper's tables; other methods follow, alphabetically.
METHOD_LABELS = {"bert": "BERT-r", "bert-mask": "BERT-mask", "ssa-co": "SSA-Co", "ssa-h": "SSA-H"}

# Columns every frame from `load_runs` has, even when no run provided them.
_BASE_COLUMNS = ("run_id", "task", "model", "method", "seed", "status", "error", "score",
                 "best_epoch", "three_subset_mean", "three_subset_std")


# ---------------------------------------------------------------- collecting run folders

def _read_json(path: Path) -> dict:
    """A JSON object from disk, or a one-line error naming the file."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: corrupt JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def _scalars(config: dict, prefix: str = "") -> dict:
    """config.json as flat scalar columns (nested keys joined with "."; lists are left out), so
    hyper-parameters such as lr, alpha, gamma can be grouped on."""
    flat = {}
    for key, value in config.items():
        if isinstance(value, dict):
            flat.update(_scalars(value, f"{prefix}{key}."))
        elif value is None or isinstance(value, (str, int, float, bool)):
            flat[prefix + key] = value
    return flat


def _run_rows(run_dir: Path) -> list[dict]:
    """The run's row; a multi-task run (metrics `per_task`) gives one row per task instead, so
    EmBERT / Gated sit next to the single-task methods in every per-task table."""
    row = _run_row(run_dir)
    metrics_path = run_dir / "metrics.json"
    per_task = _read_json(metrics_path).get("per_task") if metrics_path.exists() else None
    if not per_task:
        return [row]
    three = _read_json(metrics_path).get("per_task_three_subset") or {}
    shared = {k: v for k, v in row.items() if "/" not in k}
    return [{**shared, "task": name, **values, "multitask_run": row["run_id"],
             "three_subset_mean": three.get(name, {}).get("mean"),
             "three_subset_std": three.get(name, {}).get("std")}
            for name, values in per_task.items()]


def _run_row(run_dir: Path) -> dict:
    """One table row from one run folder (see `load_runs`)."""
    config_path, metrics_path = run_dir / "config.json", run_dir / "metrics.json"
    config = _read_json(config_path) if config_path.exists() else {}
    if metrics_path.exists():
        metrics = _read_json(metrics_path)
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
    for key, value in _scalars(config).items():
        row.setdefault(key, value)              # what metrics.json says wins over the config
    row["run_dir"] = str(run_dir)
    return row


def load_runs(run_dirs: str | os.PathLike | Iterable[str | os.PathLike]) -> pd.DataFrame:
    """One row per run folder: identity, status, best-dev metrics, selection stats, costs, config.

    `run_dirs` is either the runs root (outputs/runs: every non-hidden sub-folder is a run) or an
    iterable of run folders. Columns: run_id, task, model, method, seed, status, error, each
    best_dev metric under its own name (accuracy, f1, accuracy_mm, score ...), best_epoch,
    three_subset_mean/std, wall_<part>_s, train_examples_per_s, peak_memory_mb, then the
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
    from kit.batch import load_profile, profile_path
    from kit.config import ConfigError, RunConfig
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


def score_scale(task_name: str, rows: pd.DataFrame | None = None) -> int:
    """100 for tasks whose numbers are fractions shown x100 (everything but rmse), else 1."""
    rows = pd.DataFrame() if rows is None else rows
    return 100 if _percent_task(task_name, rows) else 1


# ---------------------------------------------------------------- tasks, methods, order

def _task_rank(task) -> tuple:
    """GLUE order first (the paper's column order), any other task after, by name."""
    return (PAPER_TASKS.index(task), "") if task in PAPER_TASKS else (len(PAPER_TASKS), str(task))


def _method_rank(method) -> tuple:
    order = list(METHOD_LABELS)
    return (order.index(method), "") if method in order else (len(order), str(method))


def _official_metrics(task_name: str, rows: pd.DataFrame) -> tuple[str, ...]:
    """The metric columns a table shows for a task (MRPC: f1, accuracy; MNLI: accuracy, _mm)."""
    if task_name == "csv":   # CSV tasks are built per file: regression ones report rmse
        regression = "rmse" in rows.columns and rows["rmse"].notna().any()
        return csv_task(("text",), None if regression else ("0", "1")).metrics
    try:
        return reported_metrics(get_task(str(task_name)))
    except ValueError:       # a task this kit version does not know: its score is all we have
        return ("score",)


def _percent_task(task_name: str, rows: pd.DataFrame) -> bool:
    """Whether a task's numbers are fractions shown x100 (not an rmse, which keeps its units)."""
    return "rmse" not in _official_metrics(task_name, rows)


def _sorted_groups(df: pd.DataFrame, keys: Sequence[str]):
    """df.groupby(keys) in table order: tasks in GLUE order, methods in the paper's order."""
    def rank(key_values):
        named = dict(zip(keys, key_values))
        return tuple(_task_rank(v) if k == "task" else _method_rank(v) if k == "method"
                     else (str(v),) for k, v in named.items())
    groups = dict(list(df.groupby(list(keys), dropna=False, sort=False)))
    return [(key, groups[key]) for key in sorted(groups, key=rank)]


def _ok_runs(rows: pd.DataFrame, what: str) -> pd.DataFrame:
    """The OK runs of one table cell, which must be one run per seed: several runs per seed
    mean several hyper-parameter configurations are mixed, which no mean over seeds should do."""
    ok = rows[rows["status"] == "ok"]
    if ok["seed"].duplicated().any():
        raise ValueError(f"{what}: several OK runs for one seed: select one configuration per "
                         f"group first (select_by_three_subsets / select_by_best_dev), or group "
                         f"by the hyper-parameters")
    return ok


def _status_counts(rows: pd.DataFrame) -> dict[str, int]:
    return {s: int((rows["status"] == s).sum()) for s in ("failed", "missing")}


# ---------------------------------------------------------------- tables

def summary_table(df: pd.DataFrame, by: Sequence[str] = ()) -> pd.DataFrame:
    """Per task x model x method (x the `by` columns, e.g. ["gamma"]): over the seeds of the OK
    runs, mean and sample std of the task score and each official metric (fractions), the number
    of seeds, and how many runs failed or are missing. k-fold runs (n_folds >= 2) are
    summarised per fold: each fold is its own dev set, never averaged with seeds (fold_table
    gives the mean over folds)."""
    keys = ["task", "model", "method", *by]
    if "fold" not in keys and len(_fold_runs(df)):
        keys.append("fold")
    rows = []
    for key, group in _sorted_groups(df, keys):
        ok = _ok_runs(group, "/".join(map(str, key)))
        row = dict(zip(keys, key), n_seeds=len(ok), **{
            f"n_{s}": n for s, n in _status_counts(group).items()})
        for metric in ("score", *_official_metrics(key[0], group)):
            values = ok[metric] if metric in ok.columns else pd.Series(dtype=float)
            row[f"{metric}_mean"], row[f"{metric}_std"] = values.mean(), values.std()
        rows.append(row)
    return pd.DataFrame(rows)


def _joined(values: list[float] | None, spec: str) -> str:
    """A cell's numbers the paper's way, "88.9/84.8"; "" when there are none."""
    return "/".join(format(v, spec) for v in values) if values else ""


def _measured_cell(task: str, rows: pd.DataFrame, baseline: pd.DataFrame | None,
                   what: str) -> tuple[list[float] | None, str]:
    """One measured cell: (the metric means as shown, its text). The mark says the task score
    is significantly higher than the baseline's (Welch over seeds), as the paper's marks do."""
    if rows.empty:                            # the method was not run on this task
        return None, ""
    ok, counts = _ok_runs(rows, what), _status_counts(rows)
    notes = ", ".join([f"n={len(ok)}"] + [f"{n} {s}" for s, n in counts.items() if n])
    if ok.empty:
        return None, f"n/a ({notes})"
    scale, spec = (100, ".1f") if _percent_task(task, rows) else (1, ".3f")
    metrics = _official_metrics(task, rows)
    means = [ok[m].mean() * scale for m in metrics]
    mark = ""
    if baseline is not None and ok["score"].mean() > baseline["score"].mean():
        mark = significance_mark(welch_test(ok["score"], baseline["score"]))
    spread = f" ± {_joined([ok[m].std() * scale for m in metrics], spec)}" if len(ok) > 1 else ""
    return means, f"{_joined(means, spec)}{mark}{spread} ({notes})"   # no std from one seed


def _avg(cells: dict[str, list[float] | None], percent_tasks: list[str]) -> str:
    """GLUE-style average: mean over tasks of each task's score (the mean of its metrics, so an
    F1/acc pair counts once). Only over x100 tasks, and only when every one has a value."""
    if not percent_tasks or any(cells.get(t) is None for t in percent_tasks):
        return "n/a"
    return f"{np.mean([np.mean(cells[t]) for t in percent_tasks]):.1f}"


def _published_rows(label: str, row: PaperRow, means: dict, tasks: list[str],
                    percent_tasks: list[str]) -> dict[str, dict]:
    """The paper's row for a method and the measured-minus-published row, over the table's
    tasks (tasks outside the paper's tables stay blank)."""
    published = {t: [row.values[f"{t}/{m}"] for m in reported_metrics(GLUE_TASKS[t])]
                 if t in PAPER_TASKS else None for t in tasks}
    deltas = {t: [m - p for m, p in zip(means[t], published[t])]
              if means[t] and published[t] else None for t in tasks}
    return {
        f"{label} (paper)": {"Avg": _avg(published, percent_tasks), **{
            t: _joined(published[t], ".1f") + row.marks.get(t, "") for t in tasks}},
        f"{label} (measured - paper)": {"Avg": _avg(deltas, percent_tasks), **{
            t: _joined(deltas[t], "+.1f") for t in tasks}},
    }


def paper_table_for(model: str) -> str:
    """The paper's table to compare a backbone with: roberta-large / roberta-base for RoBERTa
    names, large for other "large" names, else base (Table 2, BERT-base; also the closest
    comparison for the small embedded model)."""
    name = str(model).lower()
    if "roberta" in name:
        return "roberta-large" if "large" in name else "roberta-base"
    return "large" if "large" in name else "base"


def paper_table(df: pd.DataFrame, baseline: str = "bert", paper: str | None = None
                ) -> pd.DataFrame:
    """The paper's Table 2 layout from the runs in `df` (one configuration per seed).

    Rows: methods (BERT-r, BERT-mask, SSA-Co, SSA-H, then others), per model when `df` holds
    several (labels get " [model]"). Columns: Avg, then the tasks present in GLUE order, then
    other tasks. A cell is "mean/mean* ± std/std (n=.., k failed, k missing)" x100 with one
    decimal (MRPC/QQP F1/acc, STS-B pearson/spearman, MNLI m/mm); "*"/"**" mark a task score
    significantly higher than the `baseline` method's (two-sided Welch test over seeds,
    p < 0.05 / 0.01; like the paper, lower scores are never marked). Avg is the GLUE average of
    the task scores, "n/a" when a task has no OK run.
    k-fold CSV runs are left out (fold_table and oof_metrics are their tables).

    `paper` ("base", "large", "roberta-base", "roberta-large") adds under each method the
    paper's row "<label> (paper)" and "<label> (measured - paper)"; "auto" picks the table per
    model (`paper_table_for`). The paper's numbers are
    GLUE test scores of full-size models; deltas of dev runs of other backbones are no
    reproduction check, the gains over the baseline row are the comparable part.
    """
    df = df.dropna(subset=["task", "method"])   # folders with neither metrics nor config
    df = df.drop(_fold_runs(df).index)          # k-fold CSV runs: see fold_table
    tasks = sorted(df["task"].unique(), key=_task_rank)
    percent_tasks = [t for t in tasks if _percent_task(t, df[df["task"] == t])]
    several_models = df["model"].nunique() > 1
    table = {}
    for (model, method), runs in _sorted_groups(df, ["model", "method"]):
        label = METHOD_LABELS.get(method, str(method)) + (f" [{model}]" if several_models else "")
        base = df[(df["model"] == model) & (df["method"] == baseline) & (df["status"] == "ok")]
        cells = {t: _measured_cell(t, runs[runs["task"] == t],
                                   None if method == baseline else base[base["task"] == t],
                                   f"{label} on {t}") for t in tasks}
        means = {t: cell[0] for t, cell in cells.items()}
        table[label] = {"Avg": _avg(means, percent_tasks), **{t: c[1] for t, c in cells.items()}}
        published = paper_table_for(model) if paper == "auto" else paper
        if published and (row := paper_row(published, method)):
            table.update(_published_rows(label, row, means, tasks, percent_tasks))
    out = pd.DataFrame.from_dict(table, orient="index", columns=["Avg", *tasks])
    out.index.name = "Model"
    return out


# ---------------------------------------------------------------- k-fold CSV runs

# Metric columns a fold table shows, in this order, when the runs have them (regression CSV
# tasks: rmse, mse, pearson, spearman; classification: accuracy, f1, f1_macro).
_FOLD_METRICS = ("rmse", "mse", "pearson", "spearman", "accuracy", "f1", "f1_macro", "mcc")
_FOLD_KEYS = ("task", "model", "method", "seed")


def _fold_runs(df: pd.DataFrame) -> pd.DataFrame:
    """The k-fold runs of a load_runs frame (config n_folds >= 2)."""
    if "n_folds" not in df.columns or "fold" not in df.columns:
        return df.iloc[0:0]
    return df[pd.to_numeric(df["n_folds"], errors="coerce").fillna(0) >= 2]


def fold_table(df: pd.DataFrame, by: Sequence[str] = ()) -> pd.DataFrame:
    """Per task x model x method x seed (x the `by` columns): one row per fold run (its fold,
    status, best-dev metrics, best epoch, run id), then a row "mean ± std" over the OK folds
    (sample std; "n=ok/k" says how many of the k folds finished). Regression CSV tasks show
    rmse, mse, pearson, spearman (rmse/mse in the target's units); classification ones accuracy
    and F1. Several OK runs for one fold of a group mean mixed configurations: pass the
    hyper-parameters that differ as `by`."""
    df = _fold_runs(df)
    keys = [*_FOLD_KEYS, *by]
    metrics = [m for m in _FOLD_METRICS if m in df.columns and df[m].notna().any()]
    rows = []
    for key, group in _sorted_groups(df, keys):
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
        config_path, metrics_path = run_dir / "config.json", run_dir / "metrics.json"
        if not (config_path.exists() and metrics_path.exists()):
            continue
        config = _read_json(config_path)
        if int(config.get("n_folds") or 0) < 2 or _read_json(metrics_path).get("status") != "ok":
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
    if len(_fold_runs(runs)) and ("fold" in varying or runs["fold"].nunique() > 1):
        tables["Folds (per fold; mean ± std over folds)"] = fold_table(runs, by)
        oof = oof_predictions(runs["run_dir"], columns=by)
        if len(oof):
            tables["Out-of-fold (all folds' dev predictions together)"] = oof_metrics(oof, by)
    else:
        tables["Summary (mean ± std over seeds)"] = summary_table(runs, by)
    tables["Runs"] = runs
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
    for key, group in _sorted_groups(df, list(group_keys)):
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
                   baseline: str = "bert", candidate_keys: Sequence[str] | None = None
                   ) -> dict[str, pd.DataFrame]:
    """The tables of notebooks/results.ipynb from collected runs: the paper's layout (with the
    paper's rows and deltas when `paper` is set) and the summary over seeds, both of the
    configuration `rule` selects per task x model x method, and, when hyper-parameters vary,
    the selection table (three-subset rule next to best-dev). Ready for `write_tables`."""
    ok = df[df["status"] == "ok"] if len(df) else df
    if ok.empty:
        raise ValueError("no finished (status ok) runs to tabulate: run the profile first "
                         "(./run_all.sh PROFILE) or check outputs_dir / profile")
    selected = select_runs(df, rule, candidate_keys=candidate_keys)
    if not set(ok["task"]) & set(PAPER_TASKS):
        paper = None                    # no task of the paper's tables: no rows to compare
    tables = {"Paper layout": paper_table(selected, baseline=baseline, paper=paper or None),
              "Summary over seeds": summary_table(selected)}
    selection = selection_table(df, candidate_keys=candidate_keys)
    if len(selection):
        tables["Model selection"] = selection
    return tables


# ---------------------------------------------------------------- writing

def _markdown(frame: pd.DataFrame) -> str:
    """A GitHub markdown table (pandas' to_markdown needs the optional `tabulate` package)."""
    def cell(value) -> str:
        if pd.isna(value):
            return ""
        if isinstance(value, float):
            return f"{value:.6g}"
        return str(value).replace("|", "\\|").replace("\n", " ")
    lines = [[str(c) for c in frame.columns], ["---"] * frame.shape[1],
             *([cell(v) for v in row] for row in frame.itertuples(index=False))]
    return "".join("| " + " | ".join(line) + " |\n" for line in lines)


def _with_index(table: pd.DataFrame) -> pd.DataFrame:
    """The table with a named index (paper_table's "Model") as its first column; an unnamed
    index is only row numbers and is dropped."""
    named = any(name is not None for name in table.index.names)
    return table.reset_index(drop=not named)


def write_tables(tables: pd.DataFrame | Mapping[str, pd.DataFrame], name: str,
                 tables_dir: str | os.PathLike) -> list[Path]:
    """Write `<name>.md`, `<name>.csv` and `<name>.tex` under `tables_dir`, each atomically
    (kit.io: a crash leaves the old file or the new one, never half of one).

    `tables` is one table, or {title: table} for several in one file set (a profile's summary,
    paper table and selection): md gets a "## title" section per table, tex a captioned tabular
    per table, csv one frame with a leading `table` column. All three texts are built before
    anything is written, so a formatting error leaves the old files untouched.
    """
    named = {name: tables} if isinstance(tables, pd.DataFrame) else dict(tables)
    several = not isinstance(tables, pd.DataFrame)
    frames = {title: _with_index(t) for title, t in named.items()}
    md = "\n".join((f"## {title}\n\n" if several else "") + _markdown(f)
                   for title, f in frames.items())
    csv = (pd.concat([f.assign(table=title)[["table", *f.columns]] for title, f in frames.items()])
           if several else frames[name]).to_csv(index=False)
    tex = "\n".join(f.to_latex(index=False, escape=True, na_rep="", float_format="{:.6g}".format,
                               caption=title if several else None)
                    for title, f in frames.items()).replace("±", r"$\pm$")  # robust in any TeX
    paths = [Path(tables_dir) / f"{name}.{ext}" for ext in ("md", "csv", "tex")]
    for path, text in zip(paths, (md, csv, tex)):
        kio.write_text(path, text)            # tmp file beside it, then os.replace
    return paths


def write_results(tables: pd.DataFrame | Mapping[str, pd.DataFrame],
                  outputs_dir: str | os.PathLike = "outputs", profile: str | None = None,
                  name: str = "") -> list[Path]:
    """`write_tables` into `<outputs_dir>/tables/` as `name`, by default `<profile>-results`
    (`all-results` without a profile; a YAML path's stem), beside the batch runner's own
    `<profile>.{md,csv,tex}`."""
    stem = Path(profile).stem if profile and profile.endswith((".yaml", ".yml")) else profile
    return write_tables(tables, name or f"{stem or 'all'}-results", Path(outputs_dir) / "tables")
