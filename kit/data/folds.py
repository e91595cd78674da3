"""Fold ids for k-fold runs on CSV tasks (the Kaggle habit: train k models, each validated on
one fold)."""
from __future__ import annotations

import numpy as np
import pandas as pd


def assign_folds(n_folds: int, seed: int, labels=None, regression: bool = False,
                 n_bins: int = 10, given=None, n_rows: int | None = None) -> np.ndarray:
    """One fold id (int64, 0-based) per row.

    given:  a fold column from the data. Its distinct values, in sorted order, become 0..k-1
            (a column already holding 0..k-1 is unchanged); k < n_folds is an error, k > n_folds
            is allowed (the caller validates on folds 0..n_folds-1 only).
    labels: class ids -> StratifiedKFold, so every fold keeps the class proportions;
            regression targets (regression=True) -> StratifiedKFold on `n_bins` quantile bins
            of the target (fewer when ties merge bins), so every fold spans the target range.
    neither: KFold over `n_rows` rows.
    Splits are shuffled with `seed`, so the same seed gives the same folds.
    """
    if n_folds < 2:
        raise ValueError(f"n_folds must be at least 2, got {n_folds}")
    if given is not None:
        return _folds_from_column(np.asarray(given), n_folds)
    if labels is None:
        if n_rows is None:
            raise ValueError("assign_folds needs labels, a fold column or n_rows")
        target = None
    else:
        labels = np.asarray(labels)
        n_rows = len(labels)
        # Quantile bins turn a continuous target into classes StratifiedKFold can balance.
        target = (pd.qcut(labels, q=n_bins, labels=False, duplicates="drop") if regression
                  else labels)
    if n_rows < n_folds:
        raise ValueError(f"cannot split {n_rows} rows into {n_folds} folds")
    # here, not at the top: sklearn.model_selection imports scipy, which single-task kernels skip
    from sklearn.model_selection import KFold, StratifiedKFold

    splitter_class = KFold if target is None else StratifiedKFold
    splitter = splitter_class(n_folds, shuffle=True, random_state=seed)
    folds = np.empty(n_rows, dtype=np.int64)
    for fold, (_, valid) in enumerate(splitter.split(np.zeros(n_rows), target)):
        folds[valid] = fold
    return folds


def _folds_from_column(given: np.ndarray, n_folds: int) -> np.ndarray:
    if pd.isna(given).any():
        raise ValueError(f"fold column has {int(pd.isna(given).sum())} empty values")
    values, folds = np.unique(given, return_inverse=True)
    if len(values) < n_folds:
        raise ValueError(f"fold column has {len(values)} distinct values "
                         f"({', '.join(map(str, values))}) but n_folds={n_folds}")
    return folds.astype(np.int64)
