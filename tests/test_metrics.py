"""kit.metrics against values worked out by hand."""
import math
import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats

from kit.metrics import (compute_metrics, evaluate_splits, heldout_epoch, holm, is_constant,
                         permutation_test, reported_metrics, significance_mark, three_subset_stats,
                         three_subsets, welch_test)
from kit.tasks import csv_task, get_task

# 2 true positives, 1 false negative, 1 false positive, 2 true negatives.
LABELS = [1, 1, 1, 0, 0, 0]
PREDS = [1, 1, 0, 0, 0, 1]


def test_binary_classification_by_hand():
    m = compute_metrics(get_task("MRPC"), PREDS, LABELS)
    assert m["accuracy"] == pytest.approx(4 / 6)
    assert m["f1"] == pytest.approx(2 / 3)             # precision 2/3, recall 2/3
    assert m["score"] == pytest.approx(2 / 3)          # mean of F1 and accuracy
    assert "mcc" not in m                               # only where it is the official metric


def test_cola_mcc_by_hand():
    m = compute_metrics(get_task("CoLA"), PREDS, LABELS)
    # (TP*TN - FP*FN) / sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN)) = (4 - 1) / sqrt(81)
    assert m["mcc"] == pytest.approx(1 / 3)
    assert m["score"] == pytest.approx(1 / 3)


def test_f1_positive_class_is_one():
    # Flipping which class is "positive" changes F1: class 1 has 1 TP, 1 FP, 0 FN -> 2/3;
    # class 0 would give 4/5.
    m = compute_metrics(get_task("RTE"), [1, 1, 0, 0, 0], [1, 0, 0, 0, 0])
    assert m["f1"] == pytest.approx(2 / 3)


def test_regression_correlations_by_hand():
    # x = 1..4, y = 1, 2, 3, 10: ranks agree perfectly; Pearson = 14 / sqrt(5 * 50).
    m = compute_metrics(get_task("STS-B"), [1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 10.0])
    assert m["pearson"] == pytest.approx(14 / math.sqrt(250))
    assert m["spearman"] == pytest.approx(1.0)
    assert m["score"] == pytest.approx((14 / math.sqrt(250) + 1) / 2)


def test_regression_accepts_a_column_of_outputs():
    m = compute_metrics(get_task("STS-B"), np.array([[1.0], [3.0], [2.0]]), [1.0, 2.0, 3.0])
    assert m["pearson"] == pytest.approx(0.5)


def test_constant_predictions_give_zero_not_nan():
    with warnings.catch_warnings():
        warnings.simplefilter("error")                 # no ConstantInputWarning either
        m = compute_metrics(get_task("STS-B"), [2.5, 2.5, 2.5], [1.0, 2.0, 3.0])
        c = compute_metrics(get_task("CoLA"), [1, 1, 1, 1], [0, 1, 0, 1])
        f = compute_metrics(get_task("MRPC"), [0, 0, 0], [1, 0, 1])
    assert m["pearson"] == 0.0 and m["spearman"] == 0.0 and m["score"] == 0.0
    assert c["mcc"] == 0.0
    assert f["f1"] == 0.0


def test_csv_regression_scores_minus_rmse():
    m = compute_metrics(csv_task(("text",), None), [1.0, 2.0, 3.0], [1.0, 2.0, 5.0])
    assert m["mse"] == pytest.approx(4 / 3)
    assert m["rmse"] == pytest.approx(math.sqrt(4 / 3))
    assert m["score"] == pytest.approx(-math.sqrt(4 / 3))


def test_csv_classification_has_macro_f1():
    m = compute_metrics(csv_task(("text",), ("a", "b", "c")), [0, 1, 2, 2], [0, 1, 2, 1])
    # per-class F1: 1, 2/3 (P 1, R 1/2), 2/3 (P 1/2, R 1)
    assert m["f1_macro"] == pytest.approx((1 + 2 / 3 + 2 / 3) / 3)
    assert m["score"] == pytest.approx((0.75 + m["f1_macro"]) / 2)
    assert "f1" not in m                                # three classes: no binary F1


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="predictions"):
        compute_metrics(get_task("RTE"), [1, 0], [1, 0, 1])
    with pytest.raises(ValueError, match="argmax"):
        compute_metrics(get_task("RTE"), np.zeros((3, 2)), [1, 0, 1])


def test_mnli_mismatched_metrics_get_the_mm_suffix():
    task = get_task("MNLI")
    m = evaluate_splits(task, {"dev_matched": ([0, 1, 2, 2], [0, 1, 2, 0]),
                               "dev_mismatched": ([0, 1], [0, 0])})
    assert m == pytest.approx({"accuracy": 0.75, "accuracy_mm": 0.5, "score": 0.625})
    assert reported_metrics(task) == ("accuracy", "accuracy_mm")
    with pytest.raises(ValueError, match="dev_mismatched"):
        evaluate_splits(task, {"dev_matched": ([0], [0])})


def test_single_split_task_keeps_plain_names():
    task = get_task("MRPC")
    assert evaluate_splits(task, {"dev": (PREDS, LABELS)}) == compute_metrics(task, PREDS, LABELS)
    assert reported_metrics(task) == ("f1", "accuracy")


def test_three_subsets_are_fixed_even_and_shuffled():
    parts = three_subsets(10)
    assert sorted(len(p) for p in parts) == [3, 3, 4]
    assert sorted(np.concatenate(parts)) == list(range(10))
    assert all((a == b).all() for a, b in zip(parts, three_subsets(10)))   # same every call
    big = three_subsets(1042)                           # CoLA dev size
    assert [len(p) for p in big] == [348, 347, 347]
    assert not (np.sort(big[0]) == np.arange(348)).all()                  # not the first third
    with pytest.raises(ValueError):
        three_subsets(2)


def test_three_subset_stats_score_each_subset():
    task = get_task("RTE")
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 2, 30)
    preds = np.where(rng.random(30) < 0.7, labels, 1 - labels)
    out = three_subset_stats(task, preds, labels)
    expected = [float(np.mean(preds[i] == labels[i])) for i in three_subsets(30)]
    assert out["subsets"] == pytest.approx(expected)
    assert out["mean"] == pytest.approx(np.mean(expected))
    assert out["std"] == pytest.approx(np.std(expected))          # ddof=0
    assert three_subset_stats(task, preds, labels) == out          # deterministic
    assert three_subset_stats(task, preds, labels, seed=1)["subsets"] != out["subsets"]


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


def test_heldout_epoch_selects_on_subset_one_and_reports_the_others():
    # subset 1 scores 0.6, 0.7, 0.7: epoch 1 (the first of the tie); reported (0.64 + 0.66) / 2
    epochs = [[0.6, 0.9, 0.9], [0.7, 0.64, 0.66], [0.7, 0.5, 0.5]]
    assert heldout_epoch(epochs) == (1, pytest.approx(0.65))
    with pytest.raises(ValueError):
        heldout_epoch([])


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
