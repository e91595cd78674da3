"""Hyper-parameter selection over a grid's runs: the paper's three-subset rule (section 4.3),
plain best-dev selection for comparison, and the table that puts the two side by side. Works
on `kit.results.frame.collect.load_runs` frames; reads no run folder."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from kit.results.tables.build import score_scale, sorted_groups

# Hyper-parameters a grid may vary (the paper's section 4.3 grid and the SSA knobs).
HYPERPARAMETERS = ("lr", "batch_size", "epochs", "alpha", "beta", "gamma", "warmup_ratio",
                   "weight_decay", "max_length", "max_train_examples", "mask_ratio",
                   "mask_scheme", "label_rule", "label_merge", "hybrid_weighting",
                   "attention_threshold", "ssa_start_epoch", "layer_decay", "guide_loss")
SELECTION_RULES = ("three_subset", "best_dev", "none")


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


def varying_hyperparameters(df: pd.DataFrame,
                            group_keys: Sequence[str] = ("task", "model", "method")) -> list[str]:
    """The HYPERPARAMETERS columns that take several values inside some group: the candidate
    keys a selection rule chooses among."""
    present = [k for k in HYPERPARAMETERS if k in df.columns]
    if df.empty or not present:
        return []
    counts = df.groupby(list(group_keys), dropna=False)[present].nunique(dropna=False)
    return [k for k in present if (counts[k] > 1).any()]


def _candidate_keys(df: pd.DataFrame, group_keys: Sequence[str],
                    candidate_keys: Sequence[str] | None) -> list[str]:
    return list(varying_hyperparameters(df, group_keys) if candidate_keys is None
                else candidate_keys)


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
    keys = _candidate_keys(df, group_keys, candidate_keys)
    if rule == "none" or not keys or df.empty:
        return df
    select = select_by_three_subsets if rule == "three_subset" else select_by_best_dev
    return select(df, list(group_keys), keys)


def _configuration(row: pd.Series, keys: Sequence[str]) -> str:
    return " ".join(f"{k}={row[k]:g}" if isinstance(row[k], float) else f"{k}={row[k]}"
                    for k in keys)


def _picks(picked: pd.DataFrame, group_keys: list[str], keys: list[str]) -> dict[tuple, dict]:
    """Per group (its key tuple), what a rule picked among the OK runs: the configuration, its
    mean score and three-subset criterion over seeds (fractions), and its number of seeds."""
    ok = picked[picked["status"] == "ok"]
    ok = ok.assign(config=[_configuration(row, keys) for _, row in ok.iterrows()],
                   criterion=ok["three_subset_mean"] - ok["three_subset_std"])
    stats = (ok.groupby(group_keys, dropna=False, sort=False)
             .agg(config=("config", "first"), score=("score", "mean"),
                  criterion=("criterion", "mean"), seeds=("score", "size")))
    return {k if isinstance(k, tuple) else (k,): v for k, v in stats.to_dict("index").items()}


def selection_table(df: pd.DataFrame, group_keys: Sequence[str] = ("task", "model", "method"),
                    candidate_keys: Sequence[str] | None = None) -> pd.DataFrame:
    """The paper's three-subset rule next to plain best-dev selection, per group: the
    configuration each picks, its mean best-dev score over seeds (x100 where the task is
    shown x100), its three-subset mean - std criterion, and whether the two rules agree.
    Empty when no hyper-parameter varies (nothing to select)."""
    keys = _candidate_keys(df, group_keys, candidate_keys)
    if not keys or df.empty:
        return pd.DataFrame(columns=[*group_keys, "candidates"])
    group_keys = list(group_keys)
    picks = {rule: _picks(select_runs(df, rule, group_keys, keys), group_keys, keys)
             for rule in ("three_subset", "best_dev")}
    rows = []
    for key, group in sorted_groups(df, group_keys):
        named = dict(zip(group_keys, key))
        scale = score_scale(named.get("task", ""), group)
        ok = group[group["status"] == "ok"]
        row = {**named, "candidates": len(ok.drop_duplicates(keys))}
        chosen = {}
        for rule, picked in picks.items():
            if key not in picked:
                row.update({f"{rule}_config": "", f"{rule}_score": np.nan})
                continue
            pick = picked[key]
            chosen[rule] = pick["config"]
            row.update({f"{rule}_config": pick["config"],
                        f"{rule}_score": np.round(pick["score"] * scale, 2),
                        f"{rule}_criterion": np.round(pick["criterion"] * scale, 2),
                        f"{rule}_seeds": pick["seeds"]})
        row["same"] = len(set(chosen.values())) == 1 and len(chosen) == 2
        rows.append(row)
    return pd.DataFrame(rows)
