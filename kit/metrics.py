"""GLUE metrics, the paper's three-subset dev statistics (section 4.3) and significance tests.

Everything here works on plain arrays of predictions and labels, so the training loop and the
report share one definition of every number. Metric values are fractions (0.843, not 84.3);
tables multiply by 100.
"""
from __future__ import annotations

import itertools
import math
import warnings

import numpy as np
from scipy import stats
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef, mean_squared_error

from kit.tasks import Task

# Suffix of the metric names of a task's second, third ... dev split. MNLI's mismatched split is
# "_mm" as in the GLUE leaderboard; any other extra split would get "_<split name>".
_SPLIT_SUFFIXES = {"dev_mismatched": "_mm"}


def _as_1d(values, what: str) -> np.ndarray:
    """A 1-D array; an (n, 1) column of regression outputs is accepted and flattened."""
    arr = np.asarray(values)
    if arr.ndim == 2 and arr.shape[1] == 1:
        arr = arr[:, 0]
    if arr.ndim != 1:
        raise ValueError(f"{what} must be 1-D (class ids or regression values), got shape "
                         f"{arr.shape}; take the argmax of logits first")
    return arr


def _correlation(fn, predictions: np.ndarray, labels: np.ndarray) -> float:
    # A constant side (e.g. a collapsed regression head that predicts the mean everywhere) makes
    # the correlation undefined: scipy warns and returns NaN. We report 0.0 instead - "no linear /
    # rank relation" - so a degenerate run averages and sorts like a bad run, not like a hole.
    if np.ptp(predictions) == 0 or np.ptp(labels) == 0:
        return 0.0
    return float(fn(predictions, labels)[0])


def _metric_names(task: Task) -> list[str]:
    """Which metrics one split gets: the usual ones for its kind, plus the task's official ones."""
    if task.regression:
        names = ["pearson", "spearman"] + (["rmse", "mse"] if task.kind == "csv" else [])
    else:
        names = ["accuracy"] + (["f1"] if task.num_labels == 2 else [])
        names += ["f1_macro"] if task.kind == "csv" else []
    return names + [m for m in task.metrics if m not in names]    # e.g. CoLA's mcc


def task_score(task: Task, metrics: dict[str, float]) -> float:
    """The GLUE per-task score used for model selection: higher is better.

    Mean of the task's official metrics (MRPC: mean of F1 and accuracy, like the GLUE average).
    An rmse-based task (CSV regression) scores -rmse alone: averaging an error with a correlation
    would mix two scales.
    """
    if "rmse" in task.metrics:
        return -metrics["rmse"]
    return float(np.mean([metrics[m] for m in task.metrics]))


def compute_metrics(task: Task, predictions, labels) -> dict[str, float]:
    """All metrics of one split, plus `score` (see `task_score`). Values are fractions."""
    preds, gold = _as_1d(predictions, "predictions"), _as_1d(labels, "labels")
    if len(preds) != len(gold) or len(gold) == 0:
        raise ValueError(f"{task.name}: {len(preds)} predictions for {len(gold)} labels")
    if task.regression:
        preds, gold = preds.astype(np.float64), gold.astype(np.float64)
    compute = {
        "accuracy": lambda: accuracy_score(gold, preds),
        # zero_division=0: a run that never predicts class 1 has F1 0, not a warning.
        "f1": lambda: f1_score(gold, preds, pos_label=1, average="binary", zero_division=0),
        "f1_macro": lambda: f1_score(gold, preds, average="macro", zero_division=0),
        "mcc": lambda: matthews_corrcoef(gold, preds),      # sklearn gives 0.0 when degenerate
        "pearson": lambda: _correlation(stats.pearsonr, preds, gold),
        "spearman": lambda: _correlation(stats.spearmanr, preds, gold),
        "mse": lambda: mean_squared_error(gold, preds),
        "rmse": lambda: np.sqrt(mean_squared_error(gold, preds)),
    }
    metrics = {name: float(compute[name]()) for name in _metric_names(task)}
    metrics["score"] = task_score(task, metrics)
    return metrics


def split_suffix(task: Task, split: str) -> str:
    """Metric-name suffix of a dev split: "" for the first (main) one, "_mm" for MNLI-mm."""
    if split == task.dev_splits[0]:
        return ""
    return _SPLIT_SUFFIXES.get(split, f"_{split}")


def reported_metrics(task: Task) -> tuple[str, ...]:
    """The official metric names over all dev splits, in the paper's order.

    MRPC -> ("f1", "accuracy"), MNLI -> ("accuracy", "accuracy_mm"). These are the numbers a
    GLUE table shows, and the keys `evaluate_splits` writes.
    """
    return tuple(m + split_suffix(task, s) for s in task.dev_splits for m in task.metrics)


def evaluate_splits(task: Task, results: dict[str, tuple]) -> dict[str, float]:
    """Dev metrics over all of `task.dev_splits`, from {split: (predictions, labels)}.

    Metrics of extra splits carry a suffix (MNLI: `accuracy`, `accuracy_mm`); `score` is the mean
    of the splits' scores (MNLI counts m and mm equally, as the GLUE average does).
    """
    if set(results) != set(task.dev_splits):
        raise ValueError(f"{task.name}: expected dev splits {list(task.dev_splits)}, "
                         f"got {sorted(results)}")
    merged, scores = {}, []
    for split in task.dev_splits:
        metrics = compute_metrics(task, *results[split])
        scores.append(metrics.pop("score"))
        suffix = split_suffix(task, split)
        merged.update({name + suffix: value for name, value in metrics.items()})
    merged["score"] = float(np.mean(scores))
    return merged


def flatten_metrics(metrics: dict, prefix: str = "") -> dict[str, float]:
    """{"RTE": {"accuracy": ..}, "score": ..} -> {"RTE/accuracy": .., "score": ..}: a multi-task
    run's per-task dev metrics as flat numeric columns (a single-task dict comes back as is)."""
    out = {}
    for key, value in metrics.items():
        if isinstance(value, dict):
            out.update(flatten_metrics(value, f"{prefix}{key}/"))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[f"{prefix}{key}"] = value
    return out


def three_subsets(n: int, seed: int = 0) -> list[np.ndarray]:
    """Indices of the three dev subsets: a fixed shuffle of range(n), cut into even thirds.

    The permutation depends only on (n, seed), so every run on a dev set is scored on the same
    subsets and runs stay comparable. Shuffling matters: contiguous thirds would be biased, e.g.
    CoLA dev lists its in-domain sentences before the out-of-domain ones.
    """
    if n < 3:
        raise ValueError(f"three subsets need at least 3 dev examples, got {n}")
    return np.array_split(np.random.default_rng(seed).permutation(n), 3)


def three_subset_stats(task: Task, predictions, labels, seed: int = 0) -> dict:
    """The paper's section 4.3 statistic: the task score on each of three even dev subsets.

    Returns {"mean", "std", "subsets": [s1, s2, s3]}. `std` is the population std (ddof=0): it
    describes the spread of these three numbers, it does not estimate anything beyond them.
    """
    preds, gold = _as_1d(predictions, "predictions"), _as_1d(labels, "labels")
    if len(preds) != len(gold):
        raise ValueError(f"{task.name}: {len(preds)} predictions for {len(gold)} labels")
    subsets = [compute_metrics(task, preds[idx], gold[idx])["score"]
               for idx in three_subsets(len(gold), seed)]
    return {"mean": float(np.mean(subsets)), "std": float(np.std(subsets)), "subsets": subsets}


def heldout_epoch(subsets_per_epoch: list[list[float]]) -> tuple[int, float]:
    """Model selection that does not see what it reports: the epoch (index into the list) with
    the highest task score on dev subset 1 of `three_subsets` (the earliest on ties, as the
    training loop keeps the first best), and the mean of that epoch's scores on subsets 2 and 3.
    Each epoch's entry is its three_subset_stats "subsets" list."""
    if not subsets_per_epoch:
        raise ValueError("heldout_epoch: no epochs")
    best = int(np.argmax([s[0] for s in subsets_per_epoch]))
    return best, float(np.mean(subsets_per_epoch[best][1:]))


def is_constant(values) -> bool:
    """Whether a cell's values over seeds are all equal (at least 2 of them): a degenerate cell,
    e.g. CoLA MCC 0.0 from a model that predicts the majority class on every seed. Its std of 0
    is no measurement of spread, and a test against it says nothing about a method."""
    values = np.asarray(values, dtype=np.float64)
    return len(values) >= 2 and bool(np.ptp(values) == 0)


def welch_test(a, b) -> float:
    """Two-sided p-value of Welch's t-test (unequal variances), each seed one independent sample.

    With fewer than 2 samples on a side: 1.0 ("no evidence"). Both sides constant (no variance at
    all), where the t statistic is undefined: 1.0 when the two constants are equal, 0.0 when they
    differ - given the data the difference is certain; such cells are degenerate (`is_constant`)
    and the tables flag them rather than trust the 0.
    """
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if len(a) < 2 or len(b) < 2:
        return 1.0
    if np.var(a) == 0 and np.var(b) == 0:
        return 1.0 if a[0] == b[0] else 0.0
    with warnings.catch_warnings():
        # One constant side (e.g. WNLI, where every seed predicts the majority class) is a
        # well-defined test, but scipy warns about "precision loss" for identical values.
        warnings.filterwarnings("ignore", "Precision loss", RuntimeWarning)
        return float(stats.ttest_ind(a, b, equal_var=False).pvalue)


# Above this many splits of the pooled samples the permutation test draws (seeded) instead of
# enumerating; 5 vs 5 seeds have 252 splits, 10 vs 10 have 184,756.
MAX_PERMUTATIONS = 200_000


def permutation_test(a, b) -> float:
    """Two-sided p-value of the permutation test of the difference of means: the share of all
    ways to split the pooled samples into groups of len(a) and len(b) whose |mean difference|
    is at least the observed one. Exact (every split enumerated) up to MAX_PERMUTATIONS splits.

    It assumes nothing about the distribution of seed scores, which n = 3 cannot check. The
    price: with 3 vs 3 seeds there are only C(6, 3) = 20 splits, so the smallest p-value is
    2/20 = 0.1 and nothing can reach p < 0.05; 5 vs 5 seeds reach 2/252 = 0.008.
    1.0 ("no evidence") when a side has fewer than 2 samples, as welch_test.
    """
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if len(a) < 2 or len(b) < 2:
        return 1.0
    pooled, n = np.concatenate([a, b]), len(a)
    if math.comb(len(pooled), n) <= MAX_PERMUTATIONS:       # every split, exactly
        groups = np.array(list(itertools.combinations(range(len(pooled)), n)))
        splits = np.zeros((len(groups), len(pooled)), dtype=bool)
        np.put_along_axis(splits, groups, True, axis=1)
    else:                                                    # a seeded sample of splits
        rng = np.random.default_rng(0)
        order = np.argsort(rng.random((MAX_PERMUTATIONS, len(pooled))), axis=1)
        splits = order < n
    diffs = np.abs(splits @ pooled / n - ~splits @ pooled / len(b))
    observed = abs(a.mean() - b.mean())
    # a split whose difference equals the observed one up to rounding counts as "at least":
    # without the tolerance, p(a, b) and p(b, a) differ when means tie (seeds often score alike)
    tolerance = 1e-9 * max(1.0, float(np.abs(pooled).max()))
    return float(np.mean(diffs >= observed - tolerance))


SIGNIFICANCE_TESTS = {"welch": welch_test, "permutation": permutation_test}


def holm(pvalues) -> np.ndarray:
    """Holm-Bonferroni adjusted p-values (Holm 1979), in the input order: the k-th smallest of m
    p-values is multiplied by m - k + 1, then made non-decreasing along that order, capped at 1.
    Marking adjusted p < 0.05 keeps the chance of any false mark among the m comparisons (the
    family: one table's comparisons) at 5%. NaN entries are no comparison: they stay NaN and do
    not count in m."""
    p = np.asarray(pvalues, dtype=np.float64)
    out = np.full(p.shape, np.nan)
    present = np.flatnonzero(~np.isnan(p))
    order = present[np.argsort(p[present], kind="stable")]
    m = len(order)
    scaled = p[order] * (m - np.arange(m))
    out[order] = np.minimum(np.maximum.accumulate(scaled), 1.0)
    return out


def significance_mark(p: float) -> str:
    """The paper's marks: "**" for p < 0.01, "*" for p < 0.05, else ""."""
    if p < 0.01:
        return "**"
    return "*" if p < 0.05 else ""
