"""Which tables a set of runs gets: a profile's tables (what kit.batch writes after a grid) and the
results notebook's tables (the configuration a selection rule picks, in the paper's layout, with its
comparisons, summaries and epoch views). Ready for kit.results.tables.writers.write_tables."""
from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from kit import methods
from kit.config.run_config import RunConfig
from kit.results.tables.fold_tables import fold_table, oof_metrics, oof_predictions
from kit.results.tables.paper_results import PAPER_TASKS, profile_paper
from kit.results.tables.paper_table import paper_table
from kit.results.frame.collect import table_notes
from kit.results.frame.no_runs import NoRuns, run_command
from kit.results.tables.selection import select_runs, selection_table
from kit.train.progress import epoch_number
from kit.results.tables.build import (budget_view, comparisons, epoch_table, epoch_view,
                                       fold_runs, runs_table, summary_table)


def profile_tables(runs: pd.DataFrame, varying: Sequence[str] = ()) -> dict[str, pd.DataFrame]:
    """The tables of one profile's runs, for write_tables: the fine-tuning runs' (below), then
    masked-LM pretraining runs' own table (their score is a negated loss, not a task metric)."""
    pretraining = runs["method"].isin(methods.names(pretrain=True))
    tables = _finetune_tables(runs[~pretraining], varying) if (~pretraining).any() else {}
    if pretraining.any():
        tables.update(with_notes({PRETRAINING: pretrain_table(runs[pretraining])},
                                 table_notes(runs[pretraining])))
    return tables


PRETRAINING = "Pretraining (held-out masked-LM loss of the best epoch)"


def pretrain_table(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per pretraining run: the held-out masked-LM loss and perplexity of its best
    epoch (counted from 1), and where the adapted model went (adapted_dir; else its
    checkpoint/best)."""
    columns = ["run_id", "task", "model", "seed", "status", "mlm_loss", "perplexity",
               "best_epoch", "mlm_probability", "whole_word_mask", "pretrain_eval_text",
               "adapted_dir"]
    table = runs[[c for c in columns if c in runs.columns]].reset_index(drop=True)
    if "best_epoch" in table:
        table["best_epoch"] = epoch_number(pd.to_numeric(table["best_epoch"])).astype("Int64")
    return table


def _finetune_tables(runs: pd.DataFrame, varying: Sequence[str] = ()) -> dict[str, pd.DataFrame]:
    """The tables of fine-tuning runs. `varying`: the grid axes with more
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
    return with_notes(tables, table_notes(runs, by))


def with_notes(tables: dict[str, pd.DataFrame], notes: list[str]) -> dict[str, pd.DataFrame]:
    """Each table carries the lines it must show above itself (`attrs["notes"]`: mixed
    environments, too few seeds per cell), which kit.results.tables.writers and the batch print."""
    for table in tables.values():
        table.attrs["notes"] = notes
    return tables


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

    `paper`: "auto" adds the paper's rows (and measured - paper deltas) as the profile's
    `paper:` key asks (kit.results.tables.paper_results.profile_paper: a table, each model's
    table, or none), a table name ("base" ...) always, "" never. Masked-LM pretraining runs are left out (their score is no task metric:
    `pretrain_table`). Ready for `write_tables`."""
    if len(df):
        df = df[~df["method"].isin(methods.names(pretrain=True))]
    ok = df[df["status"] == "ok"] if len(df) else df
    if ok.empty:
        raise NoRuns(f"no finished (status ok) runs to tabulate: run the profile first "
                     f"(`{run_command(profile) if profile else './run_all.sh PROFILE'}`) or "
                     "check outputs_dir / profile")
    selected = select_runs(df, rule, candidate_keys=candidate_keys)
    if "budget" in selected.columns:       # runs from before the budget knob trained "epochs"
        selected = selected.assign(budget=selected["budget"].fillna("epochs"))
    if paper == "auto":                 # the profile's `paper:` key (a copy keeps its rows)
        paper = {"none": None}.get(asked := profile_paper(profile), asked)
    if not set(ok["task"]) & set(PAPER_TASKS):
        paper = None                    # no task of the paper's tables
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
    return with_notes(tables, table_notes(selected, by))
