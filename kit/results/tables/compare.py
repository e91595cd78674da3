"""Compare a few run folders by hand, without a profile: `compare_runs(run_dirs)`.

The runs are grouped by method and by the config fields that differ between runs of one task
and model (seeds and the fields that do not change what is computed, RunConfig._NOT_IDENTITY,
aside), e.g. by lr when two lrs of one method were run; task and model stay columns of their
own, since no mean is taken across tasks. Per group: n, the mean and std over its runs of the
task score and each metric (kit.results.tables.build.summary_table), and the test of each group
against a baseline group on the task score with Holm-Bonferroni across the table
(kit.results.tables.build.comparisons, with kit.results.frame.stats' Welch / permutation tests).
`latest_runs` finds the run folders started last, for a notebook that compares them.
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import pandas as pd

from kit import runs
from kit.config.paths import project_path
from kit.config.run_config import RunConfig
from kit.results.tables import build
from kit.results.frame.collect import damaged_line, environments_line, load_runs

# config fields that never make a group: a run's seed, a k-fold run's fold (summary_table keeps
# folds apart itself) and what does not change the numbers (the run id's own list)
NOT_GROUPS = ("seed", "fold", *RunConfig._NOT_IDENTITY)
PER_TASK = ("task", "model")          # columns of their own, never pooled


def latest_runs(outputs_dir: str | os.PathLike = "outputs", n: int = 4) -> list[Path]:
    """The `n` run folders under <outputs_dir>/runs that started last (by their config.json),
    oldest first; fewer when there are fewer, [] when there is none."""
    root = runs.runs_root(outputs_dir)
    started = [d for d in (runs.run_folders(root) if root.is_dir() else [])
               if runs.config_path(d).exists()]
    return sorted(started, key=lambda d: runs.config_path(d).stat().st_mtime)[-n:] if n else []


def differing_fields(df: pd.DataFrame) -> list[str]:
    """What to group the runs of `df` on, in RunConfig's order: `method` when it differs at
    all, and the other RunConfig fields (scalar ones: load_runs' columns; NOT_GROUPS aside)
    whose value differs between runs of one task and model (a field that differs only
    between tasks, e.g. max_length, is the tasks' setting, not a group)."""
    fields = [f.name for f in dataclasses.fields(RunConfig)
              if f.name not in (*NOT_GROUPS, *PER_TASK) and f.name in df.columns]
    text = df[[*PER_TASK, *fields]].astype(str)
    within = text.groupby(list(PER_TASK))[fields].nunique(dropna=False).max()
    return [f for f in fields if within[f] > 1
            or f == "method" and text[f].nunique(dropna=False) > 1]


def group_labels(df: pd.DataFrame, keys: Sequence[str]) -> pd.Series:
    """Each run's group as text: the value itself when the one key is `method` (so the
    baseline is spelled `bert`), else `key=value, ...`; "all runs" without keys."""
    if not keys:
        return pd.Series("all runs", index=df.index)
    if list(keys) == ["method"]:
        return df["method"].astype(str)
    return df[list(keys)].astype(str).apply(
        lambda row: ", ".join(f"{k}={v}" for k, v in row.items()), axis=1)


def compare_runs(run_dirs: Iterable[str | os.PathLike], by: Sequence[str] | None = None,
                 baseline: str | None = None, test: str = "welch") -> pd.DataFrame:
    """One row per task x model x group of `run_dirs` (`by`: the config fields to group on;
    default `differing_fields`): `n` OK runs, n_failed, n_missing, n_damaged, `score` as
    "mean ± std" (x100 where the task is shown x100), then score_mean, score_std and
    <metric>_mean / _std (fractions; std: sample std over the group's runs), degenerate, and
    against `baseline` (a group label; default `bert` when grouping by method, else the first
    group): diff (x100 where shown x100), p (two-sided `test`: welch or permutation), p_holm
    (Holm-Bonferroni across the table) and mark. attrs: caption, notes (a line naming the
    damaged runs, one naming the groups of one run, one when the runs' environments differ),
    baseline."""
    df = load_runs([project_path(d) for d in run_dirs])    # "outputs/runs/.." from notebooks/ too
    if df.empty:
        raise ValueError("compare_runs: no run folders given")
    keys = list(by) if by is not None else differing_fields(df)
    missing = [k for k in keys if k not in df.columns]
    if missing:
        raise ValueError(f"compare_runs: by={missing}: not a column of these runs (config "
                         f"fields: {', '.join(differing_fields(df)) or 'none differ'})")
    groups = [k for k in keys if k not in PER_TASK]
    column = groups[0] if len(groups) == 1 else "group"
    df = df.assign(method=group_labels(df, groups))       # tables.* group on `method`
    summary = build.summary_table(df)
    labels = list(dict.fromkeys(summary["method"]))
    baseline = baseline or ("bert" if groups == ["method"] and "bert" in labels else labels[0])
    if baseline not in labels:
        raise ValueError(f"compare_runs: baseline {baseline!r} is no group; groups: "
                         f"{', '.join(labels)}")
    tested = build.comparisons(df, baseline=baseline, test=test)
    out = summary.merge(tested[["model", "task", "method", "diff", "p", "p_holm", "mark"]],
                        on=["model", "task", "method"], how="left")
    scales = [build.score_scale(t, df[df["task"] == t]) for t in out["task"]]
    out.insert(3, "score", [build.mean_std(m * s, sd * s, 1) for m, sd, s in zip(
        out["score_mean"], out["score_std"], scales)])
    out = out.rename(columns={"method": column, "n_seeds": "n"})
    out.attrs.update(baseline=baseline, notes=_notes(df, out, column), caption=_caption(
        baseline, test, len(tested)))
    return out


def _notes(df: pd.DataFrame, out: pd.DataFrame, column: str) -> list[str]:
    """The lines to read before the numbers: damaged runs, groups of one run, mixed
    environments."""
    single = [f"{row[column]} ({row['task']})" for _, row in out.iterrows() if row["n"] == 1]
    lines = [damaged_line(df)]
    lines += [f"one run in {', '.join(single)}: no std, and no test can tell it from the "
              "baseline (p = 1); run more seeds"] if single else []
    lines.append(environments_line(df))
    return [line for line in lines if line]


def _caption(baseline: str, test: str, comparisons: int) -> str:
    return (f"Per task, model and group: n OK runs, the task score's mean ± sample std over "
            f"them (x100 where the task is shown x100; the _mean / _std columns are fractions). "
            f"diff: the group's mean minus {baseline}'s (x100 where shown x100); p: two-sided "
            f"{build.TEST_NAMES[test]} on the task score; p_holm: Holm-Bonferroni across these "
            f"{comparisons} comparisons; marks (*, **: p_holm < 0.05, 0.01) on gains only.")
