"""kit.results.frame.stats: Welch's t-test, the permutation test, Holm-Bonferroni and the marks,
against values worked out by hand."""
import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats

from kit.results.frame.stats import (MAX_PERMUTATIONS, holm, is_constant, permutation_test,
                                     significance_mark, welch_test)


def test_welch_test_matches_the_formula():
    a, b = np.array([1.0, 2.0, 3.0, 4.0]), np.array([2.0, 4.0, 6.0, 8.0, 10.0])
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    t = (a.mean() - b.mean()) / math.sqrt(va + vb)
    dof = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    assert welch_test(a, b) == pytest.approx(2 * stats.t.sf(abs(t), dof))
    assert welch_test(a, b) == pytest.approx(welch_test(b, a))


def test_welch_test_without_evidence_is_one():
    assert welch_test([0.5], [0.1, 0.2]) == 1.0                  # one seed
    assert welch_test([0.5, 0.5], [0.5, 0.5]) == 1.0              # constant and equal
    assert welch_test([0.5, 0.5], [0.7, 0.8]) < 1.0               # one side varies: defined


def test_welch_test_constant_but_different_is_certain():
    # No variance on either side and different values: the data leave no doubt (p = 0); the
    # tables flag such cells as degenerate instead of trusting the 0.
    assert welch_test([0.5, 0.5, 0.5], [0.7, 0.7]) == 0.0
    assert welch_test([0.0, 0.0], [0.0, 0.0]) == 1.0
    assert is_constant([0.0, 0.0, 0.0]) and not is_constant([0.0, 0.1]) and not is_constant([0.3])


def test_holm_on_a_hand_computed_example():
    # m = 4. Sorted: 0.005, 0.01, 0.03, 0.04 -> x4, x3, x2, x1 = 0.02, 0.03, 0.06, 0.04, then
    # non-decreasing along that order: 0.02, 0.03, 0.06, 0.06. Back in the input order:
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    # capped at 1; NaN is no comparison (m = 2 here)
    out = holm([0.6, np.nan, 0.2])
    assert out[[0, 2]] == pytest.approx([0.6, 0.4]) and np.isnan(out[1])
    assert holm([0.3, 0.9]) == pytest.approx([0.6, 0.9])
    assert len(holm([])) == 0


def test_permutation_test_enumerates_the_splits():
    # 3 vs 3: C(6, 3) = 20 splits. [1, 2, 3] vs [4, 5, 6]: only the observed split and its
    # mirror reach |mean difference| 3 -> p = 2/20.
    assert permutation_test([1.0, 2.0, 3.0], [4.0, 5.0, 6.0]) == pytest.approx(0.1)
    # [1, 2, 3] vs [1.5, 5, 6]: observed |difference| 13/6; the pooled sum is 18.5, so a triple
    # with sum s gives |2s - 18.5| / 3 >= 13/6 iff s <= 6 or s >= 12.5: {1, 2, 3}, {1, 1.5, 2},
    # {1, 1.5, 3} and their complements -> 6/20.
    assert permutation_test([1.0, 2.0, 3.0], [1.5, 5.0, 6.0]) == pytest.approx(0.3)
    assert permutation_test([0.5, 0.5, 0.5], [0.5, 0.5, 0.5]) == 1.0
    assert permutation_test([0.0, 0.0, 0.0], [1.0, 1.0, 1.0]) == pytest.approx(0.1)  # the floor
    assert permutation_test([], [1.0]) == 1.0 and permutation_test([0.5], [0.1, 0.2]) == 1.0


def test_significance_marks():
    assert [significance_mark(p) for p in (0.001, 0.0099, 0.01, 0.049, 0.05, 1.0)] == [
        "**", "**", "*", "*", "", ""]


@given(st.lists(st.floats(0, 1), min_size=1, max_size=12))
def test_holm_properties(pvalues):
    p, adjusted = np.array(pvalues), holm(pvalues)
    assert (adjusted >= p - 1e-12).all() and (adjusted <= 1).all()
    assert adjusted.min() == pytest.approx(min(1.0, len(p) * p.min()))   # Bonferroni for the min
    order = np.argsort(p, kind="stable")
    assert (np.diff(adjusted[order]) >= -1e-12).all()                   # keeps the order of p


@given(st.lists(st.floats(0, 1), min_size=1, max_size=4),
       st.lists(st.floats(0, 1), min_size=1, max_size=4))
def test_permutation_test_is_symmetric_and_a_probability(a, b):
    p = permutation_test(a, b)
    assert 0 < p <= 1 and p == permutation_test(b, a)                   # to the bit


def exact_p(a, b) -> Fraction:
    """The permutation test by brute force in exact arithmetic: every split of the pooled scores
    into len(a) and len(b), counted when its |mean difference| is at least the observed one."""
    pooled = a + b
    observed = abs(Fraction(sum(a), len(a)) - Fraction(sum(b), len(b)))
    hits = splits = 0
    for group in itertools.combinations(range(len(pooled)), len(a)):
        left = [pooled[i] for i in group]
        right = [pooled[i] for i in range(len(pooled)) if i not in group]
        hits += abs(Fraction(sum(left), len(left)) - Fraction(sum(right), len(right))) >= observed
        splits += 1
    return Fraction(hits, splits)


def test_permutation_test_counts_tied_splits_on_rte_scores():
    # Dev accuracies k/277 (RTE). 5 vs 5 seeds: 20 of the 252 splits reach the observed gap
    # (several only by a tie that float rounding hides); scipy's test gave 20/252 one way and
    # 12/252 = 0.048 (a false "*") the other.
    a = [181 / 277, 177 / 277, 180 / 277, 177 / 277, 180 / 277]
    b = [174 / 277, 177 / 277, 177 / 277, 171 / 277, 177 / 277]
    assert exact_p([181, 177, 180, 177, 180], [174, 177, 177, 171, 177]) == Fraction(20, 252)
    assert permutation_test(a, b) == permutation_test(b, a) == 20 / 252
    # 3 vs 3: every split ties or beats the observed gap -> 1.0 (scipy: 0.9 one way)
    a, b = [167 / 277, 170 / 277, 168 / 277], [166 / 277, 169 / 277, 169 / 277]
    assert permutation_test(a, b) == permutation_test(b, a) == 1.0


GLUE_DEV_SIZES = [277, 408, 872, 1043, 1500, 5463]     # RTE, MRPC, SST-2, CoLA, STS-B, QNLI


@st.composite
def seed_counts(draw):
    """Correct-answer counts of 2-6 seeds a side on one dev set, in a window of 8 so seeds often
    score alike (ties), as they do."""
    n = draw(st.sampled_from(GLUE_DEV_SIZES))
    low = draw(st.integers(0, n - 8))
    side = st.lists(st.integers(low, low + 8), min_size=2, max_size=6)
    return n, draw(side), draw(side)


@given(seed_counts())
def test_permutation_test_is_exact_on_grid_scores(case):
    n, a, b = case
    p = permutation_test([k / n for k in a], [k / n for k in b])
    assert p == float(exact_p(a, b))
    assert p == permutation_test([k / n for k in b], [k / n for k in a])


def test_permutation_test_draws_above_the_limit():
    # 11 vs 11: C(22, 11) = 705,432 splits > MAX_PERMUTATIONS, so seeded draws,
    # p = (hits + 1) / (draws + 1). All scores equal: every draw ties -> exactly 1.
    assert math.comb(22, 11) > MAX_PERMUTATIONS
    assert permutation_test([0.5] * 11, [0.5] * 11) == 1.0
    # fully separated: only the observed split and its mirror (2 in 705,432) reach the gap
    a, b = [k / 277 for k in range(100, 111)], [k / 277 for k in range(200, 211)]
    p = permutation_test(a, b)
    assert p == permutation_test(b, a) == permutation_test(a, b)          # seeded
    assert 1 / (MAX_PERMUTATIONS + 1) <= p < 5 / (MAX_PERMUTATIONS + 1)
