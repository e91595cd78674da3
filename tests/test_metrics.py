"""kit.train.metrics against values worked out by hand, and against the sklearn / scipy functions it
calls (imported where first needed, so importing a training kernel loads neither)."""
import math
import subprocess
import sys
import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef, mean_squared_error

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


# ------------------------------------------------ the kit's metrics against sklearn / scipy
# Each kit.train.metrics function is the sklearn / scipy call with the kit's conventions (class 1
# is F1's positive class, zero_division=0), so the tests below compare with == (exact).

def sklearn_scores(gold, preds) -> dict:
    """The reference definitions, straight from sklearn."""
    return {"accuracy": accuracy_score(gold, preds), "mcc": matthews_corrcoef(gold, preds),
            "f1_macro": f1_score(gold, preds, average="macro", zero_division=0),
            "f1": f1_score(gold % 2, preds % 2, pos_label=1, average="binary", zero_division=0)}


def kit_scores(gold, preds) -> dict:
    return {"accuracy": accuracy(gold, preds), "mcc": mcc(gold, preds),
            "f1_macro": macro_f1(gold, preds), "f1": binary_f1(gold % 2, preds % 2)}


def class_ids(n: int, k: int, case: str, seed: int = 0):
    rng = np.random.default_rng(seed)
    gold = rng.integers(0, k, n)
    preds = np.where(rng.random(n) < 0.7, gold, rng.integers(0, k, n))
    if case == "constant_preds":                       # the majority-class collapse
        preds = np.full(n, k - 1)
    elif case == "one_class_gold":
        gold = np.zeros(n, dtype=int)
    elif case == "perfect":
        preds = gold.copy()
    return gold, preds


SINGLE_LABEL = "ignore:A single label was found"      # sklearn's warning (the reference only)


@pytest.mark.filterwarnings(SINGLE_LABEL)
@pytest.mark.parametrize("case", ["noisy", "constant_preds", "one_class_gold", "perfect"])
@pytest.mark.parametrize("k", [1, 2, 3, 5])            # k = 1: every label the same class
@pytest.mark.parametrize("n", [1, 2, 3, 17, 1000])
def test_class_metrics_equal_sklearn(n, k, case):
    gold, preds = class_ids(n, k, case, seed=n * 10 + k)
    assert kit_scores(gold, preds) == sklearn_scores(gold, preds)


@pytest.mark.filterwarnings(SINGLE_LABEL)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3)), min_size=1, max_size=80))
def test_class_metrics_equal_sklearn_on_any_labels(pairs):
    gold, preds = np.array(pairs).T
    assert kit_scores(gold, preds) == sklearn_scores(gold, preds)


def values(n: int, case: str, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=n)
    y = 0.5 * x + rng.normal(size=n)
    if case == "ties":                                  # ranks shared by several values
        x, y = np.round(x), np.round(2 * y) / 2
    elif case == "anti":
        y = -x + 1e-3 * rng.normal(size=n)
    elif case == "scaled":                              # far from 1: the rescaling before norms
        x, y = x * 1e150, y * 1e-150
    elif case == "offset":                              # small spread around a large mean
        x, y = x + 1e6, y - 1e6
    return x, y


@pytest.mark.parametrize("case", ["noisy", "ties", "anti", "scaled", "offset"])
@pytest.mark.parametrize("n", [2, 3, 10, 1000])
def test_regression_metrics_equal_scipy_and_sklearn(n, case):
    x, y = values(n, case, seed=n)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")                 # scipy's NearConstantInputWarning
        assert pearson(x, y) == float(stats.pearsonr(x, y)[0])
        assert spearman(x, y) == float(stats.spearmanr(x, y)[0])
    assert mse(y, x) == mean_squared_error(y, x)


@given(st.lists(st.tuples(st.sampled_from([-2.0, 0.0, 0.5, 3.0]) | st.floats(-1e6, 1e6),
                          st.sampled_from([0.0, 1.0, 5.0]) | st.floats(-1e6, 1e6)),
                min_size=2, max_size=50))
def test_regression_metrics_equal_scipy_on_any_values(pairs):
    x, y = np.array(pairs, dtype=np.float64).T
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")                 # constant / near-constant inputs
        for ours, theirs in ((pearson, stats.pearsonr), (spearman, stats.spearmanr)):
            expected = float(theirs(x, y)[0])
            assert ours(x, y) == expected or (math.isnan(ours(x, y)) and math.isnan(expected))
    assert mse(y, x) == mean_squared_error(y, x)


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
