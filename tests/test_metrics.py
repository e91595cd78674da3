"""kit.train.metrics against values worked out by hand, against the metrics' count formulas, and
against sklearn.metrics, which computed every result before the kit's own count formulas
(scipy's correlations are imported where first needed, so importing a training kernel loads
neither)."""
import math
import subprocess
import sys
import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

from kit.train.metrics import (accuracy, binary_f1, compute_metrics, evaluate_splits,
                               heldout_epoch, macro_f1, mcc, mse, pearson, reported_metrics,
                               spearman, three_subset_stats, three_subsets)
from kit.config.tasks import csv_task, get_task

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


def test_heldout_epoch_selects_on_subset_one_and_reports_the_others():
    # subset 1 scores 0.6, 0.7, 0.7: epoch 1 (the first of the tie); reported (0.64 + 0.66) / 2
    epochs = [[0.6, 0.9, 0.9], [0.7, 0.64, 0.66], [0.7, 0.5, 0.5]]
    assert heldout_epoch(epochs) == (1, pytest.approx(0.65))
    with pytest.raises(ValueError):
        heldout_epoch([])


# ------------------------------------------------ the kit's metrics on examples worked by hand
# What the tests pin is the kit's conventions (class 1 is F1's positive class, 0.0 for a class
# nowhere and for a degenerate MCC), with numbers worked out by hand.

def test_binary_metrics_worked_by_hand():
    # gold 1 1 1 1 0 0 0 0, preds 1 1 1 0 0 0 1 1: TP 3, FN 1, FP 2, TN 2.
    # accuracy (3 + 2) / 8 = 5/8; F1 = 2TP / (2TP + FP + FN) = 6/9 = 2/3;
    # MCC = (TP*TN - FP*FN) / sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN)) = (6 - 2) / sqrt(5*4*4*3)
    #     = 4 / sqrt(240) = 1 / sqrt(15) = 0.2582;
    # macro F1: class 0 has TP 2, FP 1, FN 2 -> 4/7; (2/3 + 4/7) / 2 = 13/21.
    gold, preds = np.array([1, 1, 1, 1, 0, 0, 0, 0]), np.array([1, 1, 1, 0, 0, 0, 1, 1])
    assert accuracy(gold, preds) == pytest.approx(5 / 8, rel=1e-12)
    assert binary_f1(gold, preds) == pytest.approx(2 / 3, rel=1e-12)
    assert mcc(gold, preds) == pytest.approx(1 / math.sqrt(15), rel=1e-12)
    assert macro_f1(gold, preds) == pytest.approx(13 / 21, rel=1e-12)


def test_three_class_metrics_worked_by_hand():
    # gold 0 0 1 1 2 2, preds 0 1 1 1 2 0: 4 of 6 right -> accuracy 2/3.
    # per-class F1 = 2TP / (2TP + FP + FN): class 0 TP 1 FP 1 FN 1 -> 1/2; class 1 TP 2 FP 1
    # FN 0 -> 4/5; class 2 TP 1 FP 0 FN 1 -> 2/3; macro (1/2 + 4/5 + 2/3) / 3 = 59/90.
    # MCC (Gorodkin's K classes): c = 4 right of s = 6, predicted counts p = 2, 3, 1, true
    # counts t = 2, 2, 2: (c*s - sum p*t) / sqrt((s^2 - sum p^2)(s^2 - sum t^2))
    #     = (24 - 12) / sqrt((36 - 14)(36 - 12)) = 12 / sqrt(528) = 3 / sqrt(33) = 0.5222.
    gold, preds = np.array([0, 0, 1, 1, 2, 2]), np.array([0, 1, 1, 1, 2, 0])
    assert accuracy(gold, preds) == pytest.approx(2 / 3, rel=1e-12)
    assert macro_f1(gold, preds) == pytest.approx(59 / 90, rel=1e-12)
    assert mcc(gold, preds) == pytest.approx(3 / math.sqrt(33), rel=1e-12)


def test_degenerate_class_metrics_worked_by_hand():
    # The majority-class collapse: preds all 1 on gold 1 0 1 0: TP 2, FP 2, FN 0 -> F1 4/6;
    # MCC's denominator has TN + FN = 0: the kit's 0.0. Never predicting class 1: F1 0/2 = 0.
    gold = np.array([1, 0, 1, 0])
    assert accuracy(gold, np.ones(4, int)) == 0.5
    assert binary_f1(gold, np.ones(4, int)) == pytest.approx(2 / 3, rel=1e-12)
    assert mcc(gold, np.ones(4, int)) == 0.0 and mcc(np.zeros(4, int), gold) == 0.0
    assert binary_f1(gold, np.zeros(4, int)) == 0.0 and mcc(gold, gold) == 1.0


def test_correlations_worked_by_hand():
    # x = 1 2 2 4, y = 1 3 2 4. Pearson: means 9/4, 5/2; deviations x -5/4 -1/4 -1/4 7/4,
    # y -3/2 1/2 -1/2 3/2; sum of products 15/8 - 1/8 + 1/8 + 21/8 = 9/2; sums of squares 19/4
    # and 5 -> (9/2) / sqrt(95/4) = 9 / sqrt(95) = 0.9234.
    # Spearman: ranks x 1 2.5 2.5 4 (the tie shares 2 and 3), y 1 3 2 4; deviations from 2.5:
    # -3/2 0 0 3/2 and -3/2 1/2 -1/2 3/2 -> 9/2 / sqrt(9/2 * 5) = sqrt(9/10) = 0.9487.
    # MSE: (0 + 1 + 0 + 0) / 4.
    x, y = np.array([1.0, 2.0, 2.0, 4.0]), np.array([1.0, 3.0, 2.0, 4.0])
    assert pearson(x, y) == pytest.approx(9 / math.sqrt(95), rel=1e-12)
    assert spearman(x, y) == pytest.approx(math.sqrt(0.9), rel=1e-12)
    assert mse(y, x) == 0.25
    # far from 1 and far from 0: a correlation does not care about scale or offset
    assert pearson(x * 1e150, y * 1e-150) == pytest.approx(9 / math.sqrt(95), rel=1e-12)
    assert pearson(x + 1e6, y - 1e6) == pytest.approx(9 / math.sqrt(95), rel=1e-9)
    assert spearman(x, -y) == pytest.approx(-math.sqrt(0.9), rel=1e-12)


@given(st.lists(st.tuples(st.integers(0, 1), st.integers(0, 1)), min_size=1, max_size=60))
def test_binary_metrics_match_their_count_formulas(pairs):
    gold, preds = np.array(pairs).T
    tp, tn = int(np.sum((gold == 1) & (preds == 1))), int(np.sum((gold == 0) & (preds == 0)))
    fp, fn = int(np.sum((gold == 0) & (preds == 1))), int(np.sum((gold == 1) & (preds == 0)))
    denominator = (tp + fp) * (tp + fn) * (tn + fp) * (tn + fn)
    assert accuracy(gold, preds) == pytest.approx((tp + tn) / len(pairs), rel=1e-12)
    assert binary_f1(gold, preds) == pytest.approx(
        2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0, rel=1e-12)
    assert mcc(gold, preds) == pytest.approx(
        (tp * tn - fp * fn) / math.sqrt(denominator) if denominator else 0.0, rel=1e-9, abs=1e-12)


def average_ranks(values) -> list[float]:
    """1-based ranks, a tie sharing the mean of the ranks it spans."""
    return [sum(v < x for v in values) + (sum(v == x for v in values) + 1) / 2 for x in values]


def plain_pearson(x, y) -> float:
    dx, dy = [v - sum(x) / len(x) for v in x], [v - sum(y) / len(y) for v in y]
    return sum(a * b for a, b in zip(dx, dy)) / math.sqrt(sum(a * a for a in dx)
                                                          * sum(b * b for b in dy))


@given(st.lists(st.tuples(st.integers(-5, 5), st.integers(-5, 5)), min_size=2, max_size=30)
       .filter(lambda p: len({a for a, _ in p}) > 1 and len({b for _, b in p}) > 1))
def test_correlations_match_their_definitions(pairs):
    x, y = np.array(pairs, dtype=np.float64).T
    assert pearson(x, y) == pytest.approx(plain_pearson(x.tolist(), y.tolist()), abs=1e-12)
    assert spearman(x, y) == pytest.approx(
        plain_pearson(average_ranks(x.tolist()), average_ranks(y.tolist())), abs=1e-12)
    assert mse(y, x) == pytest.approx(float(np.mean((y - x) ** 2)), rel=1e-12)


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3)), min_size=1, max_size=60),
       st.booleans())
def test_class_metrics_equal_sklearns_to_the_bit(pairs, binary):
    """The results published before the count formulas came from sklearn: the same numbers."""
    gold, preds = np.array(pairs).T
    if binary:
        gold, preds = gold % 2, preds % 2
        assert binary_f1(gold, preds) == f1_score(gold, preds, pos_label=1, average="binary",
                                                  zero_division=0)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "A single label was found", UserWarning)
        assert mcc(gold, preds) == matthews_corrcoef(gold, preds)
    assert accuracy(gold, preds) == accuracy_score(gold, preds)
    assert macro_f1(gold, preds) == f1_score(gold, preds, average="macro", zero_division=0)


@pytest.mark.parametrize("preds, gold", [
    ([0.5, 1.0], [0, 1]),             # fractions are no class ids
    ([0, 2, 1], [0, 1, 1]),           # three classes on a binary task
    ([0, 2], [0, 2]),                 # two classes, neither is 1
])
def test_binary_task_refuses_what_sklearn_refused(preds, gold):
    with pytest.raises(ValueError):
        f1_score(gold, preds, pos_label=1, average="binary", zero_division=0)
    with pytest.raises(ValueError):
        compute_metrics(get_task("MRPC"), preds, gold)


def test_csv_regression_refuses_nan_as_sklearn_did():
    with pytest.raises(ValueError, match="NaN"):
        compute_metrics(csv_task(("text",), None), [np.nan, 1.0, 2.0], [1.0, 2.0, 3.0])
    m = compute_metrics(get_task("STS-B"), [np.nan, 1.0, 2.0], [1.0, 2.0, 3.0])
    assert math.isnan(m["pearson"]) and math.isnan(m["spearman"])     # as scipy: propagated


@pytest.mark.parametrize("n", [1, 2])
def test_tiny_splits(n):
    reg = compute_metrics(get_task("STS-B"), [1.0, 2.0][:n], [2.0, 5.0][:n])
    # n = 1 is constant: 0.0. n = 2: scipy rounds Pearson to +-1, Spearman is np.corrcoef's
    assert reg["pearson"] == (0.0 if n == 1 else 1.0)
    assert reg["spearman"] == (0.0 if n == 1 else 0.9999999999999999)
    cls = compute_metrics(get_task("CoLA"), [1, 0][:n], [1, 0][:n])
    assert cls["accuracy"] == 1.0 and cls["mcc"] == (0.0 if n == 1 else 1.0)


def test_importing_the_training_kernel_loads_neither_scipy_nor_sklearn():
    """A grid point's kernel imports kit.train.finetune and kit.results.views.run_view: neither may
    pull scipy (~1 s) or sklearn. (Building a model still imports scipy.optimize:
    transformers.modeling_utils loads its object-detection losses, which import scipy when it is
    installed - not the kit's.)"""
    code = ("import sys, kit.train.finetune, kit.results.views.run_view; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'scipy', 'sklearn'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
