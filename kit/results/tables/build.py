"""Result tables from collected runs: table order, epoch and budget views, the significance
comparisons and the summary over seeds (the paper's Table 2 layout:
`kit.results.tables.paper_table`), with what a reviewer checks spelled out in each table's caption
(`table.attrs["caption"]`): which epoch's dev numbers are shown and how it was chosen, which test is
behind the marks, on which number (the task score), and the Holm-Bonferroni correction across the
table's comparisons. Degenerate cells (`degenerate`: the same score on every seed, or a constant
predictor's exact 0 on a correlation-scored task, one seed included) are flagged and left out of the
average.

Works on `kit.results.frame.collect.load_runs` frames only; never reads run folders itself.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from kit import methods
from kit.train.metrics import reported_metrics
from kit.results.tables.paper_results import PAPER_TASKS
from kit.results.frame.stats import SIGNIFICANCE_TESTS, holm, is_constant, significance_mark
from kit.config.tasks import csv_task, get_task

# Row order and labels of the paper's tables; other methods follow, alphabetically.
METHOD_LABELS = {name: methods.get(name).label for name in methods.names(multitask=False)}

# Which epoch's dev numbers a table shows (`epoch` of paper_table / results_tables).
EPOCH_VIEWS = {
    "best": "best epoch, chosen on the full dev set that is also reported (optimistic: the "
            "selection sees the numbers it reports)",
    "last": "last epoch (no selection on dev)",
    "heldout": "epoch chosen on dev subset 1 of 3, task score reported on subsets 2-3 (mean of "
               "the two; the reported rows never took part in the choice)",
}
TEST_NAMES = {"welch": "Welch's t-test over seeds",
              "permutation": "exact permutation test of the mean difference over seeds"}


# ---------------------------------------------------------------- tasks, methods, order

def task_rank(task) -> tuple:
    """GLUE order first (the paper's column order), any other task after, by name."""
    return (PAPER_TASKS.index(task), "") if task in PAPER_TASKS else (len(PAPER_TASKS), str(task))


def _method_rank(method) -> tuple:
    order = list(METHOD_LABELS)
    return (order.index(method), "") if method in order else (len(order), str(method))


def official_metrics(task_name: str, rows: pd.DataFrame) -> tuple[str, ...]:
    """The metric columns a table shows for a task (MRPC: f1, accuracy; MNLI: accuracy, _mm)."""
    if task_name == "csv":   # CSV tasks are built per file: regression ones report rmse
        regression = "rmse" in rows.columns and rows["rmse"].notna().any()
        return csv_task(("text",), None if regression else ("0", "1")).metrics
    try:
        return reported_metrics(get_task(str(task_name)))
    except ValueError:       # a task this kit version does not know: its score is all we have
        return ("score",)


def percent_task(task_name: str, rows: pd.DataFrame) -> bool:
    """Whether a task's numbers are fractions shown x100 (not an rmse, which keeps its units)."""
    return "rmse" not in official_metrics(task_name, rows)


def score_scale(task_name: str, rows: pd.DataFrame | None = None) -> int:
    """100 for tasks whose numbers are fractions shown x100 (everything but rmse), else 1."""
    rows = pd.DataFrame() if rows is None else rows
    return 100 if percent_task(task_name, rows) else 1


def sorted_groups(df: pd.DataFrame, keys: Sequence[str]):
    """df.groupby(keys) in table order: tasks in GLUE order, methods in the paper's order."""
    def rank(key_values):
        named = dict(zip(keys, key_values))
        return tuple(task_rank(v) if k == "task" else _method_rank(v) if k == "method"
                     else (str(v),) for k, v in named.items())
    groups = dict(list(df.groupby(list(keys), dropna=False, sort=False)))
    return [(key, groups[key]) for key in sorted(groups, key=rank)]


def ok_runs(rows: pd.DataFrame, what: str) -> pd.DataFrame:
    """The OK runs of one table cell, which must be one run per seed: several runs per seed
    mean several hyper-parameter configurations are mixed, which no mean over seeds should do."""
    ok = rows[rows["status"] == "ok"]
    if ok["seed"].duplicated().any():
        raise ValueError(f"{what}: several OK runs for one seed: select one configuration per "
                         f"group first (select_by_three_subsets / select_by_best_dev), or group "
                         f"by the hyper-parameters")
    return ok


def status_counts(rows: pd.DataFrame) -> dict[str, int]:
    """A cell's runs that gave no result, by why: failed, missing (running, killed, preempted)
    and damaged (a record that cannot be read: kit.results.frame.collect.load_runs)."""
    return {s: int((rows["status"] == s).sum()) for s in ("failed", "missing", "damaged")}


def fold_runs(df: pd.DataFrame) -> pd.DataFrame:
    """The k-fold runs of a load_runs frame (config n_folds >= 2)."""
    if "n_folds" not in df.columns or "fold" not in df.columns:
        return df.iloc[0:0]
    return df[pd.to_numeric(df["n_folds"], errors="coerce").fillna(0) >= 2]


# Metrics on which kit.train.metrics scores a constant prediction (a majority-class model, a
# collapsed regression head) exactly 0.0: MCC, Pearson, Spearman (see its `mcc`, `_correlation`).
CORRELATION_METRICS = ("mcc", "pearson", "spearman")


def degenerate(task_name, scores, rows: pd.DataFrame | None = None) -> bool:
    """Whether a cell's task scores over seeds say nothing about its method:
    - the same score on every seed (at least 2; `is_constant`): its std of 0 measures nothing;
    - or, on a task scored by correlations only (CoLA's MCC, STS-B's Pearson/Spearman), a score
      of exactly 0 on every seed, one seed included: what kit.train.metrics returns for a
      constant prediction (every CoLA row "acceptable", one STS-B value everywhere); a model
      that learned anything lands on exactly 0 with negligible probability.
    An accuracy-scored task (RTE, SST-2 ...) with one seed cannot be told apart from a bad model
    by its score alone, so one seed of it is never flagged. `rows`: the cell's runs, for the
    task's metrics (CSV tasks)."""
    values = np.asarray(pd.Series(scores, dtype="float64").dropna())
    if is_constant(values):
        return True
    metrics = official_metrics(str(task_name), pd.DataFrame() if rows is None else rows)
    return (len(values) > 0 and all(m in CORRELATION_METRICS for m in metrics)
            and bool((values == 0.0).all()))


def mean_std(mean: float, std: float, digits: int) -> str:
    """ "mean ± std"; the mean alone for one seed (std NaN), blank where nothing was measured."""
    if pd.isna(mean):
        return ""
    return f"{mean:.{digits}f}" if pd.isna(std) else f"{mean:.{digits}f} ± {std:.{digits}f}"


# ---------------------------------------------------------------- views of the runs

def epoch_view(df: pd.DataFrame, epoch: str = "best") -> pd.DataFrame:
    """The runs with `score` and the metric columns of the epoch view `epoch` (EPOCH_VIEWS):
    best (as recorded), last (load_runs' last_* columns) or heldout (heldout_score; the
    per-metric columns are blanked: only the task score exists per dev subset). An OK run that
    did not record the view (e.g. a multi-task run has no per-epoch subsets) becomes status
    "missing" there, so the tables count it instead of averaging a hole."""
    if epoch not in EPOCH_VIEWS:
        raise ValueError(f"unknown epoch view {epoch!r}: choose one of {list(EPOCH_VIEWS)}")
    if epoch == "best" or df.empty:
        return df
    metrics = {m for t in df["task"].dropna().unique() for m in official_metrics(t, df)}
    blank = {m: np.nan for m in metrics | {"score"} if m in df.columns}
    if epoch == "last":
        view = df.assign(**{**blank, **{c[len("last_"):]: df[c] for c in df.columns
                                        if c.startswith("last_")}})
    else:
        view = df.assign(**{**blank, "score": df.get("heldout_score", np.nan)})
    lost = (view["status"] == "ok") & view["score"].isna()
    return view.assign(status=view["status"].mask(lost, "missing"),
                       error=view["error"].mask(lost, f"no {epoch}-epoch metrics recorded"))


def budget_view(df: pd.DataFrame, budget: str) -> pd.DataFrame:
    """The runs of one training budget (config `budget`): per model x task x method, its runs of
    that budget, or its default-budget runs where it has none (BERT-r and union-merge SSA train
    the same steps under both budgets, so the profiles run them once)."""
    if "budget" not in df.columns:
        return df
    own = df["budget"].fillna("epochs") == budget
    has_own = own.groupby([df["model"], df["task"], df["method"]], dropna=False).transform("any")
    return df[own | (~has_own & (df["budget"].fillna("epochs") == "epochs"))]


def runs_table(runs: pd.DataFrame) -> pd.DataFrame:
    """The per-run table: identity, status and score, then only the columns that differ between
    runs (a profile's grid axes and results); run_dir and constant config fields are left out."""
    keep = ["run_id", "task", "method", "seed", "status", "score"]
    varying = runs.columns[runs.astype(str).nunique(dropna=False) > 1]
    return runs[[*keep, *(c for c in varying if c not in keep and c != "run_dir")]]


# ---------------------------------------------------------------- significance

def comparisons(df: pd.DataFrame, baseline: str = "bert", test: str = "welch") -> pd.DataFrame:
    """Every method against `baseline` per model x task on the task score over seeds (OK runs):
    model, task, method, n, n_baseline, diff (mean minus the baseline's, x100 where the task is
    shown x100), p (two-sided `test`: welch or permutation), p_holm (Holm-Bonferroni across all
    rows: the family is the table), mark ("*"/"**" on p_holm, gains only, as the paper marks)
    and degenerate (either side is a degenerate cell: `degenerate`)."""
    if test not in SIGNIFICANCE_TESTS:
        raise ValueError(f"unknown test {test!r}: choose one of {list(SIGNIFICANCE_TESTS)}")
    ok = df[df["status"] == "ok"].dropna(subset=["score"])
    scores = ok.groupby(["model", "task", "method"])["score"].agg(list)
    rows = []
    for (model, task, method), values in scores.items():
        base = scores.get((model, task, baseline))
        if method == baseline or base is None:
            continue
        scale = score_scale(task, ok[ok["task"] == task])
        rows.append({"model": model, "task": task, "method": method, "n": len(values),
                     "n_baseline": len(base),
                     "diff": (np.mean(values) - np.mean(base)) * scale,
                     "p": SIGNIFICANCE_TESTS[test](values, base),
                     "degenerate": degenerate(task, values) or degenerate(task, base)})
    out = pd.DataFrame(rows, columns=["model", "task", "method", "n", "n_baseline", "diff", "p",
                                      "degenerate"])
    out.insert(len(out.columns) - 1, "p_holm", holm(out["p"]))
    out.insert(len(out.columns) - 1, "mark", [significance_mark(p) if d > 0 else ""
                                               for p, d in zip(out["p_holm"], out["diff"])])
    order = out["task"].map(task_rank).tolist(), out["method"].map(_method_rank).tolist()
    out = (out.assign(_t=order[0], _m=order[1]).sort_values(["model", "_t", "_m"])
           .drop(columns=["_t", "_m"]).reset_index(drop=True))
    out.attrs["caption"] = (
        f"Each method against {METHOD_LABELS.get(baseline, baseline)} per model and task, on "
        f"the task score over seeds (diff x100 where the task is shown x100). p: two-sided "
        f"{TEST_NAMES[test]}; p_holm: Holm-Bonferroni across these {len(out)} comparisons; "
        f"marks on p_holm (gains only). degenerate: a side has the same score on every seed, or "
        f"scores exactly 0 on MCC / Pearson on every seed (a constant prediction).")
    return out


# ---------------------------------------------------------------- tables

def summary_table(df: pd.DataFrame, by: Sequence[str] = ()) -> pd.DataFrame:
    """Per task x model x method (x the `by` columns, e.g. ["gamma"]): over the seeds of the OK
    runs, mean and sample std of the task score and each official metric (fractions), the number
    of seeds, and how many runs failed, are missing or are damaged. k-fold runs (n_folds >= 2) are
    summarised per fold: each fold is its own dev set, never averaged with seeds (fold_table
    gives the mean over folds)."""
    keys = ["task", "model", "method", *by]
    if "fold" not in keys and len(fold_runs(df)):
        keys.append("fold")
    # a damaged run whose config.json cannot be read belongs to no cell: the line above every
    # table (kit.results.frame.collect.damaged_line) names and counts it, no blank row here
    placed = df[df["task"].notna()] if "task" in df.columns else df.iloc[:0]
    rows = []
    for key, group in sorted_groups(placed, keys):
        ok = ok_runs(group, "/".join(map(str, key)))
        metrics = [m for m in ("score", *official_metrics(key[0], group)) if m in ok.columns]
        stats = ok[metrics].agg(["mean", "std"]).unstack()
        rows.append({**dict(zip(keys, key)), "n_seeds": len(ok),
                     **{f"n_{s}": n for s, n in status_counts(group).items()},
                     **{f"{m}_{stat}": v for (m, stat), v in stats.items()},
                     "degenerate": degenerate(key[0], ok["score"], ok)})
    return pd.DataFrame(rows)


def epoch_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per task x model x method: the task score over seeds (x100 where shown x100) in each
    epoch view - best (chosen and reported on the full dev set), last, heldout (chosen on dev
    subset 1, reported on subsets 2-3) - as "mean ± std", so the optimism of best-epoch
    selection is visible next to two views without it."""
    views = {v: epoch_view(df, v) for v in EPOCH_VIEWS}
    rows = []
    for key, group in sorted_groups(df[df["status"] == "ok"], ["task", "model", "method"]):
        scale = score_scale(key[0], group)
        row = dict(zip(("task", "model", "method"), key), n=len(group))
        for view, frame in views.items():
            values = frame.loc[group.index, "score"].dropna() * scale
            row[view] = mean_std(values.mean(), values.std(), 1)
        rows.append(row)
    out = pd.DataFrame(rows, columns=["task", "model", "method", "n", *EPOCH_VIEWS])
    out.attrs["caption"] = "Task score by epoch view: " + "; ".join(
        f"{v}: {text}" for v, text in EPOCH_VIEWS.items()) + "."
    return out
