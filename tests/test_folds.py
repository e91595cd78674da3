"""Fold assignment: deterministic, a partition of the rows, stratified when labels are known."""
import numpy as np
import pytest

from kit.data.folds import assign_folds


def assert_partition(folds, n_rows, n_folds):
    assert folds.shape == (n_rows,) and folds.dtype == np.int64
    assert set(folds.tolist()) == set(range(n_folds))            # every row in exactly one fold
    sizes = np.bincount(folds)
    assert sizes.max() - sizes.min() <= n_folds                  # balanced


def test_kfold_without_labels_is_deterministic_partition():
    a = assign_folds(5, seed=1, n_rows=103)
    assert_partition(a, 103, 5)
    assert np.array_equal(a, assign_folds(5, seed=1, n_rows=103))
    assert not np.array_equal(a, assign_folds(5, seed=2, n_rows=103))


def test_classification_is_stratified():
    labels = np.array([0] * 300 + [1] * 60 + [2] * 40)
    folds = assign_folds(4, seed=0, labels=labels)
    assert_partition(folds, len(labels), 4)
    assert np.array_equal(folds, assign_folds(4, seed=0, labels=labels))
    for fold in range(4):
        counts = np.bincount(labels[folds == fold], minlength=3)
        assert np.abs(counts - [75, 15, 10]).max() <= 1


def test_regression_uses_quantile_bins():
    target = np.random.default_rng(0).lognormal(size=500).astype(np.float32)
    folds = assign_folds(5, seed=3, labels=target, regression=True, n_bins=10)
    assert_partition(folds, 500, 5)
    # Each fold gets ~10 rows of each decile, so its sorted targets track the full set's.
    deciles = np.quantile(target, np.linspace(0, 1, 11))
    bins = np.clip(np.searchsorted(deciles, target, side="right") - 1, 0, 9)
    for fold in range(5):
        assert np.abs(np.bincount(bins[folds == fold], minlength=10) - 10).max() <= 1
    with pytest.raises(ValueError):                              # continuous target needs bins
        assign_folds(5, seed=3, labels=target)


def test_given_column_is_kept_or_remapped():
    assert assign_folds(3, 0, given=[2, 0, 1, 1]).tolist() == [2, 0, 1, 1]
    assert assign_folds(2, 0, given=["b", "a", "b"]).tolist() == [1, 0, 1]
    assert assign_folds(2, 0, given=[5.0, 7.0, 9.0]).tolist() == [0, 1, 2]   # more folds: kept
    with pytest.raises(ValueError, match="2 distinct values .* n_folds=5"):
        assign_folds(5, 0, given=[1, 2, 1])
    with pytest.raises(ValueError, match="empty"):
        assign_folds(2, 0, given=[0, 1, None])


def test_bad_arguments():
    with pytest.raises(ValueError, match="n_rows"):
        assign_folds(5, 0)
    with pytest.raises(ValueError, match="at least 2"):
        assign_folds(1, 0, n_rows=10)
    with pytest.raises(ValueError, match="3 rows into 5 folds"):
        assign_folds(5, 0, n_rows=3)
