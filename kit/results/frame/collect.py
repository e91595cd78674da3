"""Collect run folders into one frame: `load_runs` (a row per run, from kit.runs' readers),
`collect_runs` (a profile's runs, filtered) and `finished` (the OK runs of some methods: the filter
every figure starts from). The tables built on that frame are kit.results.tables.build,
kit.results.tables.selection and kit.results.tables.fold_tables; kit.results.tables.table_sets picks
a profile's set and kit.results.tables.writers writes it.

Reads only what runs leave on disk (config.json, metrics.json and history.csv, through
kit.runs), never torch or the training code, so tables can be rebuilt anywhere from copied run
folders. Metric values in the run folders are fractions.
"""
from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from kit import runs
from kit.config.run_config import ConfigError, RunConfig
from kit.train.metrics import heldout_epoch
from kit.config.profiles import load_profile, profile_path

# Columns every frame from `load_runs` has, even when no run provided them.
_BASE_COLUMNS = ("run_id", "task", "model", "method", "seed", "status", "error", "score",
                 "best_epoch", "three_subset_mean", "three_subset_std")


def _scalars(config: dict) -> dict:
    """config.json as flat scalar columns (nested keys joined with "."; lists are left out), so
    hyper-parameters such as lr, alpha, gamma can be grouped on."""
    flat = pd.json_normalize(config).to_dict("records")[0]
    return {k: v for k, v in flat.items() if v is None or isinstance(v, (str, int, float, bool))}


def _run_rows(run_dir: Path) -> list[dict]:
    """The run's row; a multi-task run (metrics `per_task`) gives one row per task instead, so
    EmBERT / Gated sit next to the single-task methods in every per-task table. Each file is
    read once."""
    config, metrics = runs.read_config(run_dir) or {}, runs.read_metrics(run_dir)
    row = _run_row(run_dir, config, metrics)
    per_task = (metrics or {}).get("per_task")
    if not per_task:
        return [row]
    three = metrics.get("per_task_three_subset") or {}
    shared = {k: v for k, v in row.items() if "/" not in k}
    return [{**shared, "task": name, **values, "multitask_run": row["run_id"],
             "three_subset_mean": three.get(name, {}).get("mean"),
             "three_subset_std": three.get(name, {}).get("std")}
            for name, values in per_task.items()]


def _rows_or_damaged(run_dir: Path) -> list[dict]:
    """`_run_rows`, or for a run whose files cannot be read one row of status "damaged", its
    error naming the file and what is wrong: every table counts it, none drops it."""
    try:
        return _run_rows(run_dir)
    except (OSError, ValueError) as err:
        return [_damaged_row(run_dir, str(err).splitlines()[0])]


def _damaged_row(run_dir: Path, error: str) -> dict:
    """A damaged run's row: its identity (task, model, method, seed ...) from config.json where
    that can be read, so it is counted in its own cell; else the run id alone."""
    try:
        config = runs.read_config(run_dir) or {}
    except (OSError, ValueError):
        config = {}
    return {"run_id": run_dir.name, **_scalars(config), "status": "damaged", "error": error,
            "run_dir": str(run_dir)}


def _checked(run_dir: Path, metrics: dict | None) -> dict:
    """metrics.json as a row reads it: status ok (with a best-dev score) or failed; a run
    without one is "missing" (still running or killed), and so is a preempted one (stopped by
    a signal with a checkpoint: not finished; its error says so)."""
    if metrics is None:
        return {"status": "missing", "error": "no metrics.json: still running or killed"}
    if metrics.get("status") == "preempted":
        return {**metrics, "status": "missing",
                "error": f"preempted ({(metrics.get('preempted') or {}).get('signal')}): "
                         "rerun to resume"}
    if metrics.get("status") not in ("ok", "failed"):
        raise ValueError(f"{runs.metrics_path(run_dir)}: status must be 'ok', 'failed' or "
                         f"'preempted', got {metrics.get('status')!r}")
    if metrics["status"] == "ok" and "score" not in (metrics.get("best_dev") or {}):
        raise ValueError(f"{runs.metrics_path(run_dir)}: an ok run needs best_dev with a score")
    return metrics


def _run_row(run_dir: Path, config: dict, metrics: dict | None) -> dict:
    """One table row from one run folder's config and metrics (see `load_runs`)."""
    metrics = _checked(run_dir, metrics)
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
               peak_memory_mb=metrics.get("peak_memory_mb"),
               per_device=metrics.get("per_device") or 1)     # K points shared its device
    row.update({f"last_{k}": v for k, v in (metrics.get("last_dev") or {}).items()})
    subsets = [e["three_subset"]["subsets"] for e in metrics.get("epochs") or []
               if len((e.get("three_subset") or {}).get("subsets") or []) == 3]
    if subsets and len(subsets) == len(metrics["epochs"]):
        row["heldout_epoch"], row["heldout_score"] = heldout_epoch(subsets)
    row["train_loss_target"] = _last_target_loss(run_dir)
    for key, value in _scalars(config).items():
        row.setdefault(key, value)              # what metrics.json says wins over the config
    row["environment"] = metrics.get("environment")      # kit.train.provenance; None before it existed
    row["run_dir"] = str(run_dir)
    return row


# ---------------------------------------------------------------- what a table must say above it

# what must match for two results to be compared as equals: speed and numerics follow these
COMPARABLE = ("cpu_class", "gpu", "torch", "transformers", "accelerate", "per_device")
MIN_SEEDS = 3           # fewer runs per cell than this: a difference is not evidence


def comparable(env: dict) -> dict:
    """The fields of a run's environment (kit.train.provenance) that must match across a table. Here,
    not in kit.train.provenance: results modules read runs without importing torch. A field a partial
    record lacks reads None rather than stopping the table."""
    gpu = env.get("gpu")
    return {"cpu_class": (env.get("cpu") or {}).get("cpu_class"),
            "gpu": gpu.get("name") if gpu else "none",
            **{k: env.get(k) for k in ("torch", "transformers", "accelerate")},
            "per_device": env.get("per_device") or 1}   # K points timed on one device at once


def mixed_environments(runs: list[tuple[str, dict | None]], shown: int = 3) -> str | None:
    """None when every run shares one comparable environment; else ONE line naming each field
    that differs, its values and (up to `shown`) the runs of each value. Runs written before
    provenance existed (no environment) are named apart when mixed with runs that have one."""
    known = [(run_id, comparable(env)) for run_id, env in runs if isinstance(env, dict)]
    parts = []
    for field in COMPARABLE:
        groups: dict[str, list[str]] = {}
        for run_id, key in known:
            groups.setdefault(str(key[field]), []).append(run_id)
        if len(groups) > 1:
            parts.append(f"{field} " + " vs ".join(f"{value} ({_ids(ids, shown)})"
                                                   for value, ids in groups.items()))
    unknown = [run_id for run_id, env in runs if not isinstance(env, dict)]
    if unknown and known:
        parts.append(f"no environment recorded ({_ids(unknown, shown)})")
    return "warning: this table mixes environments: " + "; ".join(parts) if parts else None


def _ids(ids: list[str], shown: int) -> str:
    more = len(ids) - shown
    return ", ".join(ids[:shown]) + (f" and {more} more" if more > 0 else "")


def few_seeds(runs: pd.DataFrame, by: Sequence[str] = ()) -> str | None:
    """One line when a cell (task x model x method x `by`) of the finished runs has fewer than
    MIN_SEEDS runs: its mean is one or two draws, and a difference between methods is noise as
    far as anyone can tell."""
    ok = finished(runs)
    if ok.empty:
        return None
    n = int(ok.groupby(["task", "model", "method", *by], dropna=False).size().min())
    if n >= MIN_SEEDS:
        return None
    return (f"{n} run{'s' if n > 1 else ''} (seed{'s' if n > 1 else ''}) per cell: differences "
            f"between methods are not evidence (at least {MIN_SEEDS} seeds per cell are)")


def damaged_line(runs: pd.DataFrame, shown: int = 3) -> str | None:
    """One line naming the damaged runs (`load_runs`' status "damaged") and what is wrong with
    each, None when there is none: a run without a readable config.json belongs to no cell, so
    this line is where it is counted."""
    damaged = runs[runs["status"] == "damaged"] if len(runs) else runs
    if damaged.empty:
        return None
    listed = [f"{r}: {e}" for r, e in zip(damaged["run_id"], damaged["error"])]
    more = f" and {len(listed) - shown} more" if len(listed) > shown else ""
    return (f"{len(listed)} damaged run{'s' if len(listed) > 1 else ''} (a record no run "
            f"writes; counted in n, never averaged; rerunning its point retrains it): "
            f"{'; '.join(listed[:shown])}{more}")


def table_notes(runs: pd.DataFrame, by: Sequence[str] = ()) -> list[str]:
    """The lines every table of these runs shows above itself: damaged runs, mixed
    environments, thin cells."""
    lines = (damaged_line(runs), environments_line(runs), few_seeds(runs, by))
    return [line for line in lines if line]


def environments_line(runs: pd.DataFrame) -> str | None:
    """kit.runs' mixed_environments line over the finished runs, None when they share one."""
    ok = finished(runs)
    envs = ok["environment"] if "environment" in ok.columns else [None] * len(ok)
    return mixed_environments(list(zip(ok["run_id"], envs)))


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
    subset 1, its score on subsets 2-3: `kit.train.metrics.heldout_epoch`), train_loss_target (the
    last logged target-task loss, comparable across methods), then the
    config's scalar entries (lr, batch_size, epochs, alpha, beta, gamma ...), and run_dir.

    Failed runs are rows with status "failed" (their metric columns are NaN). A folder without
    metrics.json is a row with status "missing" rather than skipped: a grid's missing seeds then
    show up in the tables' counts instead of silently shrinking n. A damaged folder (a corrupt
    or truncated config.json / metrics.json, a record no run writes) is a row with status
    "damaged", its error naming the file and what is wrong, and the others go on: such a file
    is not something a finished run writes (the loop writes metrics.json atomically), so it
    needs a look rather than a guess, but one damaged run neither stops a report nor shrinks
    its n (`damaged_line` names them above the tables).
    """
    if isinstance(run_dirs, (str, os.PathLike)):
        run_dirs = runs.run_folders(run_dirs)
    df = pd.DataFrame([row for d in run_dirs for row in _rows_or_damaged(Path(d))])
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
    dirs = [runs.runs_root(outputs_dir) / run_id for run_id in ids]
    return [d for d in dirs if runs.run_started(d)]


def collect_runs(outputs_dir: str | os.PathLike = "outputs", profile: str | None = None,
                 **where) -> pd.DataFrame:
    """`load_runs` over `<outputs_dir>/runs`, optionally one profile's runs and exact-match
    filters on any column (`task="SST-2"`, `model="minilm"`; None and "" are ignored).

    `profile` is a profile name in params/ or a YAML path: its grid's runs (by run id, see
    `profile_run_dirs`); any other string matches config.json's `profile` field. An empty
    frame (with the base columns) when nothing matches."""
    root = runs.runs_root(outputs_dir)
    dirs = profile_run_dirs(profile, outputs_dir) if profile else None
    by_field = dirs is None and bool(profile)
    if dirs is None:
        dirs = runs.run_folders(root) if root.is_dir() else []
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


def finished(df: pd.DataFrame, methods: Sequence[str] | None = None,
             seed: int | None = None) -> pd.DataFrame:
    """The finished (status ok) runs of a `load_runs` frame, of `methods` and `seed` where
    given: the runs a figure, a cost table or a case study draws on."""
    if not len(df):
        return df
    keep = df["status"] == "ok"
    if methods is not None:
        keep &= df["method"].isin(list(methods))
    if seed is not None:
        keep &= df["seed"] == seed
    return df[keep]
