"""Significance tests over seeds: Welch's t-test, the exact permutation test, Holm-Bonferroni,
the paper's marks, and `is_constant` for degenerate cells.

Only the tables need these; they live apart from kit.train.metrics so that a training kernel, which
imports kit.train.metrics for the GLUE numbers, does not import scipy.stats (with sklearn.metrics it
was 0.9-1.0 s of a 2.7-2.9 s `import kit.train.finetune`, `python -X importtime` on the loaded
machine).
"""
from __future__ import annotations

import functools
import itertools
import math
import warnings

import numpy as np
from scipy import stats


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

# Two |mean differences| closer than this (times the largest |score| where that is above 1) are
# a tie. Dev scores sit on a grid (k/277 on RTE): distinct mean differences of up to 10 vs 10
# seeds on a 40,000-row dev set are at least 1 / (40,000 * 10 * 10) = 2.5e-7 apart, while a mean
# computed in floats is off by ~1e-16. scipy's permutation_test forgives only a relative ~100 eps,
# which dropped tied splits: p too low, and p(a, b) != p(b, a).
GAP_TOLERANCE = 1e-9


@functools.lru_cache(maxsize=16)   # a table tests many comparisons of the same seed counts
def _splits(n: int, k: int) -> tuple[np.ndarray, bool]:
    """Row per split: the indices of its group of k out of n pooled samples. Every one of the
    C(n, k) splits (True: exact) when there are at most MAX_PERMUTATIONS, else that many seeded
    draws (False)."""
    exact = math.comb(n, k) <= MAX_PERMUTATIONS
    if exact:
        groups = np.array(list(itertools.combinations(range(n), k)))
    else:
        groups = np.argsort(np.random.default_rng(0).random((MAX_PERMUTATIONS, n)), axis=1)[:, :k]
    groups.setflags(write=False)          # shared between calls through the cache
    return groups, exact


def permutation_test(a, b) -> float:
    """Two-sided p-value of the permutation test of the difference of means: the share of all
    ways to split the pooled samples into groups of len(a) and len(b) whose |mean difference|
    is at least the observed one, a split that ties with it (within GAP_TOLERANCE) counted.
    Exact (every split enumerated) up to MAX_PERMUTATIONS splits; above, that many seeded draws,
    p = (hits + 1) / (draws + 1), the observed split counted once, so p > 0.

    The two sides are put in one canonical order first, so p(a, b) == p(b, a) to the bit.

    It assumes nothing about the distribution of seed scores, which n = 3 cannot check. The
    price: with 3 vs 3 seeds there are only C(6, 3) = 20 splits, so the smallest p-value is
    2/20 = 0.1 and nothing can reach p < 0.05; 5 vs 5 seeds reach 2/252 = 0.008.
    1.0 ("no evidence") when a side has fewer than 2 samples, as welch_test.
    """
    # one canonical order of the two sides (the shorter first, then by value): (a, b) and
    # (b, a) then run the same arithmetic
    a, b = sorted((np.sort(np.asarray(a, dtype=np.float64)),
                   np.sort(np.asarray(b, dtype=np.float64))), key=lambda x: (len(x), x.tolist()))
    if len(a) < 2 or len(b) < 2:
        return 1.0
    pooled = np.concatenate([a, b])
    groups, exact = _splits(len(pooled), len(a))
    sums = pooled[groups].sum(axis=1)
    gaps = np.abs(sums / len(a) - (pooled.sum() - sums) / len(b))
    observed = abs(a.sum() / len(a) - (pooled.sum() - a.sum()) / len(b))
    tolerance = GAP_TOLERANCE * max(1.0, float(np.abs(pooled).max()))
    hits = int(np.count_nonzero(gaps >= observed - tolerance))
    return hits / len(groups) if exact else (hits + 1) / (len(groups) + 1)


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
