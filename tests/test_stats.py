"""kit.results.frame.stats: Welch's t-test, the permutation test, Holm-Bonferroni and the marks,
against values worked out by hand."""
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats

from kit.results.frame.stats import (holm, is_constant, permutation_test, significance_mark,
                                     welch_test)


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
    assert 0 < p <= 1 and p == pytest.approx(permutation_test(b, a))
