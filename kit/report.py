"""Collect run folders into tables: summaries over seeds, the paper's Table 2 layout, selection.

Reads only what runs leave on disk (outputs/runs/<run_id>/config.json and metrics.json), never
torch or the training code, so tables can be rebuilt anywhere from copied run folders. Metric
values in the run folders are fractions; `paper_table` shows them x100 like the paper.
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from kit import io as kio
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
    df = pd.DataFrame([_run_row(Path(d)) for d in run_dirs])
    for column in _BASE_COLUMNS:
        if column not in df.columns:
            df[column] = np.nan
    return df


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
    of seeds, and how many runs failed or are missing."""
    keys = ["task", "model", "method", *by]
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

    `paper` ("base", "large", "roberta-base", "roberta-large") adds under each method the
    paper's row "<label> (paper)" and "<label> (measured - paper)". The paper's numbers are
    GLUE test scores of full-size models; deltas of dev runs of other backbones are no
    reproduction check, the gains over the baseline row are the comparable part.
    """
    df = df.dropna(subset=["task", "method"])   # folders with neither metrics nor config
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
        if paper and (row := paper_row(paper, method)):
            table.update(_published_rows(label, row, means, tasks, percent_tasks))
    out = pd.DataFrame.from_dict(table, orient="index", columns=["Avg", *tasks])
    out.index.name = "Model"
    return out


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
