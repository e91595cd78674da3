"""GLUE metrics and the paper's three-subset dev statistics (section 4.3).

Everything here works on plain arrays of predictions and labels, so the training loop and the
report share one definition of every number. Metric values are fractions (0.843, not 84.3);
tables multiply by 100. The significance tests over seeds are in kit.results.frame.stats.

The class metrics are their count formulas on numpy's bincount, not sklearn.metrics: importing
sklearn took 1.3 s of CPU in each process that evaluates (every kernel and torchrun worker; ~6 s
for a smoke point's whole process, avx512_bf16 class), and each formula is a line. The
correlations are scipy.stats', imported where first computed (regression tasks only).
"""
from __future__ import annotations

import warnings

import numpy as np

from kit.config.tasks import Task

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


def _whole(values: np.ndarray) -> np.ndarray:
    """Class ids as integers; a fraction (or NaN) is refused: it is no class id."""
    if values.dtype.kind in "iub":
        return values.astype(np.int64)
    if not np.all(np.isfinite(values)) or np.any(values != np.round(values)):
        raise ValueError("class ids must be whole numbers; got fractions (regression outputs?)")
    return values.astype(np.int64)


def _counts(gold, preds) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(true counts, predicted counts, true positives, the class ids): per class found in either
    array, in the ids' order."""
    gold, preds = _whole(np.asarray(gold)), _whole(np.asarray(preds))
    classes, ids = np.unique(np.concatenate([gold, preds]), return_inverse=True)
    g, p, n = ids[:len(gold)], ids[len(gold):], len(classes)
    return (np.bincount(g, minlength=n), np.bincount(p, minlength=n),
            np.bincount(g[g == p], minlength=n), classes)


def accuracy(gold, preds) -> float:
    gold, preds = _whole(np.asarray(gold)), _whole(np.asarray(preds))
    return float(np.mean(gold == preds))


def _f1(tp, true, predicted):
    """2TP / (2TP + FP + FN) per class; 0.0 where a class is in neither array's rows."""
    denominator = true + predicted
    return np.divide(2 * tp, denominator, out=np.zeros(len(tp)), where=denominator > 0)


def binary_f1(gold, preds) -> float:
    """F1 of class 1; 0.0 for a run that never predicts it. Refused (ValueError) where the ids
    are not a two-class task's with 1 as one of them."""
    true, predicted, tp, classes = _counts(gold, preds)
    if len(classes) > 2 or (len(classes) == 2 and 1 not in classes):
        raise ValueError(f"F1 of class 1 needs two classes, 0 and 1; got {classes.tolist()}")
    one = classes == 1
    return float(_f1(tp[one], true[one], predicted[one]).sum())


def macro_f1(gold, preds) -> float:
    """The mean of every class's F1 (a class of either array counts)."""
    true, predicted, tp, _ = _counts(gold, preds)
    return float(np.mean(_f1(tp, true, predicted)))


def mcc(gold, preds) -> float:
    """Matthews correlation, K classes (Gorodkin): (c s - sum p t) / sqrt((s^2 - sum p^2)
    (s^2 - sum t^2)) with c rows right of s, p and t the predicted and true counts per class;
    0.0 when degenerate (one class in gold or in predictions)."""
    true, predicted, tp, _ = _counts(gold, preds)
    s = int(true.sum())
    covariance = int(tp.sum()) * s - int(true @ predicted)
    spread = float(s * s - int(predicted @ predicted)) * float(s * s - int(true @ true))
    return 0.0 if spread == 0 else float(covariance / np.sqrt(spread))


def mse(gold, preds) -> float:
    """Mean squared error; NaN or inf in either array is an error."""
    gold, preds = np.asarray(gold, dtype=np.float64), np.asarray(preds, dtype=np.float64)
    if not (np.all(np.isfinite(gold)) and np.all(np.isfinite(preds))):
        raise ValueError("mean squared error: the values contain NaN or infinity")
    return float(np.mean((gold - preds) ** 2))


def pearson(x: np.ndarray, y: np.ndarray) -> float:
    from scipy.stats import pearsonr
    with warnings.catch_warnings():       # constant / near-constant sides: see _correlation
        warnings.simplefilter("ignore", RuntimeWarning)
        return float(pearsonr(x, y)[0])


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    from scipy.stats import spearmanr
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return float(spearmanr(x, y)[0])


def _correlation(fn, predictions: np.ndarray, labels: np.ndarray) -> float:
    # A constant side (e.g. a collapsed regression head that predicts the mean everywhere) makes
    # the correlation undefined: scipy warns and returns NaN. We report 0.0 instead - "no linear /
    # rank relation" - so a degenerate run averages and sorts like a bad run, not like a hole.
    if np.ptp(predictions) == 0 or np.ptp(labels) == 0:
        return 0.0
    return fn(predictions, labels)


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
        "accuracy": lambda: accuracy(gold, preds),
        "f1": lambda: binary_f1(gold, preds),
        "f1_macro": lambda: macro_f1(gold, preds),
        "mcc": lambda: mcc(gold, preds),
        "pearson": lambda: _correlation(pearson, preds, gold),
        "spearman": lambda: _correlation(spearman, preds, gold),
        "mse": lambda: mse(gold, preds),
        "rmse": lambda: np.sqrt(mse(gold, preds)),
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
