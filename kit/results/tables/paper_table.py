"""The paper's Table 2 layout from collected runs: per method a row of "mean ± std (n=..)" cells in
GLUE column order, significance marks against BERT-r (Holm-corrected,
`kit.results.tables.build.comparisons`), degenerate cells flagged and left out of Avg, and
optionally the paper's published row and the measured-minus-published row under each method
(`kit.results.tables.paper_results`).

Works on `kit.results.frame.collect.load_runs` frames only; never reads run folders itself.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from kit.train.metrics import reported_metrics
from kit.results.tables.paper_results import PAPER_TASKS, PaperRow, paper_row
from kit.results.tables.build import (EPOCH_VIEWS, METHOD_LABELS, TEST_NAMES, comparisons,
                                       degenerate, epoch_view, fold_runs, official_metrics,
                                       ok_runs, percent_task, sorted_groups, status_counts,
                                       task_rank)
from kit.config.tasks import GLUE_TASKS

DEGENERATE = "†"     # a degenerate cell (kit.results.tables.build.degenerate)


# the paper's rows are GLUE test-server scores, the kit's dev scores: said under every table
# that shows both, since "(measured - paper)" reads like a reproduction check
PUBLISHED_NOTE = ("(paper) rows: the paper's GLUE test-server scores; (measured - paper): these "
                  "dev scores minus them. Dev and test sets differ, so a delta is no "
                  "reproduction check: the test scores come from the GLUE server "
                  "(outputs/submissions/).")


def _caption(epoch: str, test: str, baseline: str, m: int, left_out: list[str],
             published: bool = False) -> str:
    """What a paper_table shows and tested, for its caption."""
    label = METHOD_LABELS.get(baseline, baseline)
    avg = ("Avg: the average of the task scores of every column scored in percent, as GLUE "
           "averages them (a synthetic task counts as one)" + (
        f", leaving out {', '.join(left_out)} (a degenerate cell in the column)" if left_out
        else "") + ".")
    return (f"Dev metrics x100 (rmse tasks in their units), mean ± std over seeds; {EPOCH_VIEWS[epoch]}. "
            f"Marks: the task score (the mean of the task's metrics, e.g. STS-B (Pearson + "
            f"Spearman) / 2; not each metric) against {label}, two-sided {TEST_NAMES[test]}, "
            f"Holm-Bonferroni-corrected across the table's {m} comparisons: * p < 0.05, "
            f"** p < 0.01, gains only. {DEGENERATE} degenerate: the same score on every seed, or "
            f"an MCC / Pearson of exactly 0 on every seed, one seed included (a constant "
            f"prediction, e.g. a majority-class model); its mean, std and test say nothing. {avg}"
            + (f" {PUBLISHED_NOTE}" if published else ""))


def _joined(values: list[float] | None, spec: str) -> str:
    """A cell's numbers the paper's way, "88.9/84.8"; "" when there are none."""
    return "/".join(format(v, spec) for v in values) if values else ""


def _measured_cell(task: str, rows: pd.DataFrame, metrics: Sequence[str], mark: str,
                   what: str) -> tuple[list[float] | None, bool, str]:
    """One measured cell: (the metric means as shown, degenerate?, its text)."""
    if rows.empty:                            # the method was not run on this task
        return None, False, ""
    ok, counts = ok_runs(rows, what), status_counts(rows)
    # "n=3 of 4, 1 damaged": the runs without a result stay in sight, never a smaller n alone
    shown = f"n={len(ok)}" + (f" of {len(rows)}" if len(rows) > len(ok) else "")
    notes = ", ".join([shown] + [f"{n} {s}" for s, n in counts.items() if n])
    if ok.empty:
        return None, False, f"n/a ({notes})"
    scale, spec = (100, ".1f") if percent_task(task, rows) else (1, ".3f")
    means = [ok[m].mean() * scale for m in metrics]
    flagged = degenerate(task, ok["score"], ok)
    flag = DEGENERATE if flagged else ""
    spread = f" ± {_joined([ok[m].std() * scale for m in metrics], spec)}" if len(ok) > 1 else ""
    return means, flagged, f"{_joined(means, spec)}{mark}{flag}{spread} ({notes})"


def _avg(cells: dict[str, list[float] | None], tasks: list[str]) -> str:
    """GLUE-style average: mean over tasks of each task's score (the mean of its metrics, so an
    F1/acc pair counts once). Only over `tasks`, and only when every one has a value."""
    if not tasks or any(cells.get(t) is None for t in tasks):
        return "n/a"
    return f"{np.mean([np.mean(cells[t]) for t in tasks]):.1f}"


def _published_rows(label: str, row: PaperRow, means: dict, tasks: list[str],
                    avg_tasks: list[str]) -> dict[str, dict]:
    """The paper's row for a method and the measured-minus-published row, over the table's
    tasks (tasks outside the paper's tables stay blank)."""
    published = {t: [row.values[f"{t}/{m}"] for m in reported_metrics(GLUE_TASKS[t])]
                 if t in PAPER_TASKS else None for t in tasks}
    deltas = {t: [m - p for m, p in zip(means[t], published[t])]
              if means[t] and published[t] and len(means[t]) == len(published[t]) else None
              for t in tasks}
    return {
        f"{label} (paper)": {"Avg": _avg(published, avg_tasks), **{
            t: _joined(published[t], ".1f") + row.marks.get(t, "") for t in tasks}},
        f"{label} (measured - paper)": {"Avg": _avg(deltas, avg_tasks), **{
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


def paper_table(df: pd.DataFrame, baseline: str = "bert", paper: str | None = None,
                test: str = "welch", epoch: str = "best") -> pd.DataFrame:
    """The paper's Table 2 layout from the runs in `df` (one configuration per seed).

    Rows: methods (BERT-r, BERT-mask, SSA-Co, SSA-H, then others), per model when `df` holds
    several (labels get " [model]"). Columns: Avg, then the tasks present in GLUE order, then
    other tasks. A cell is "mean/mean* ± std/std (n=.. of .., k failed, k missing, k damaged)"
    x100 with one decimal (MRPC/QQP F1/acc, STS-B pearson/spearman, MNLI m/mm; the task score
    alone in the heldout `epoch` view). "*"/"**" mark a task score significantly higher than
    the `baseline` method's (`comparisons`: two-sided `test`, Holm-corrected across the table,
    p < 0.05 / 0.01; lower scores are never marked). "†" flags a degenerate cell (the same
    score on every seed, or a constant predictor's exact 0 on MCC / Pearson, one seed included:
    `kit.results.tables.build.degenerate`); a task with one is left out of every row's Avg, so
    the averages stay comparable.
    Avg averages the task scores as GLUE does, over every percent-scored column (a synthetic task
    counts as one), "n/a" when a task has no OK run. The caption
    (`.attrs["caption"]`) says all this. k-fold CSV runs are left out (see fold_table).

    `paper` ("base", "large", "roberta-base", "roberta-large") adds under each method the
    paper's row "<label> (paper)" and "<label> (measured - paper)"; "auto" picks the table per
    model (`paper_table_for`). The paper's numbers are GLUE test scores of full-size models;
    deltas of dev runs of other backbones are no reproduction check.
    """
    df = epoch_view(df.dropna(subset=["task", "method"]), epoch)
    df = df.drop(fold_runs(df).index)           # k-fold CSV runs: see fold_table
    tasks = sorted(df["task"].unique(), key=task_rank)
    percent = [t for t in tasks if percent_task(t, df[df["task"] == t])]
    shown = {t: ("score",) if epoch == "heldout" else official_metrics(t, df[df["task"] == t])
             for t in tasks}
    tests = comparisons(df, baseline, test)
    marks = tests.set_index(["model", "task", "method"])["mark"].to_dict()
    several_models = df["model"].nunique() > 1
    rows = []
    for (model, method), runs in sorted_groups(df, ["model", "method"]):
        label = METHOD_LABELS.get(method, str(method)) + (f" [{model}]" if several_models else "")
        cells = {t: _measured_cell(t, runs[runs["task"] == t], shown[t],
                                   marks.get((model, t, method), ""), f"{label} on {t}")
                 for t in tasks}
        published = paper_table_for(model) if paper == "auto" else paper
        rows.append((label, method, published, cells))
    left_out = [t for t in percent if any(cells[t][1] for *_, cells in rows)]
    avg_tasks = [t for t in percent if t not in left_out]
    table, any_published = {}, False
    for label, method, published, cells in rows:
        means = {t: cell[0] for t, cell in cells.items()}
        table[label] = {"Avg": _avg(means, avg_tasks), **{t: c[2] for t, c in cells.items()}}
        if published and (row := paper_row(published, method)):
            table.update(_published_rows(label, row, means, tasks, avg_tasks))
            any_published = True
    out = pd.DataFrame.from_dict(table, orient="index", columns=["Avg", *tasks])
    out.index.name = "Model"
    out.attrs["caption"] = _caption(epoch, test, baseline, len(tests), left_out, any_published)
    return out
