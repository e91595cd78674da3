"""GLUE metrics and the paper's three-subset dev statistics (section 4.3).

Everything here works on plain arrays of predictions and labels, so the training loop and the
report share one definition of every number. Metric values are fractions (0.843, not 84.3);
tables multiply by 100. The significance tests over seeds are in kit.results.frame.stats.

numpy only, on purpose: every kernel (one per batch, kit.cluster.kernels) imports this module; its former
sklearn.metrics + scipy.stats imports were 0.9-1.0 s of a 2.7-2.9 s `import kit.train.finetune`
(`python -X importtime`, shared loaded 2-core machine; CPU time of `import kit.train.finetune,
kit.results.views.views` 2.4 s -> 1.7 s without them). Each metric repeats the float operations of
the sklearn / scipy function it replaced, in the same order, so the numbers are the same to the last
bit (tests/test_metrics.py compares them with == on random inputs).
"""
from __future__ import annotations

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


def _class_ids(values: np.ndarray, what: str) -> np.ndarray:
    """Refuse what sklearn refused as "continuous": float class ids that are not whole numbers
    (or NaN / inf), e.g. regression outputs fed to a classification task."""
    if values.dtype.kind == "f" and not np.all(np.isfinite(values) & (values == np.round(values))):
        raise ValueError(f"{what} of a classification task must be class ids, got fractions")
    return values


def _confusion(gold: np.ndarray, preds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(classes, C): the classes present in either array, sorted, and C[i, j] = how many
    examples of class i were predicted as class j (sklearn's confusion_matrix)."""
    classes, codes = np.unique(np.concatenate([gold, preds]), return_inverse=True)
    k = len(classes)
    flat = codes[:len(gold)] * k + codes[len(gold):]
    return classes, np.bincount(flat, minlength=k * k).reshape(k, k)


def _f1_per_class(confusion: np.ndarray) -> np.ndarray:
    """F1 of every class, 2 tp / (2 tp + fp + fn) as sklearn writes it (2.0 * tp / (true + pred));
    0.0 for a class neither true nor predicted (sklearn's zero_division=0: a run that never
    predicts class 1 has F1 0, not a warning)."""
    tp = np.diag(confusion).astype(np.float64)
    denominator = confusion.sum(axis=1) + confusion.sum(axis=0)     # (tp + fn) + (tp + fp)
    return np.divide(2.0 * tp, denominator, out=np.zeros_like(tp), where=denominator > 0)


def accuracy(gold, preds) -> float:
    """Share of exact matches (sklearn's accuracy_score: the mean of gold == preds)."""
    return float(np.mean(gold == preds))


def binary_f1(gold, preds) -> float:
    """F1 of class 1. Like sklearn's average="binary", an error when the classes present are
    not a subset of two that include 1 (class ids from a multi-class head)."""
    classes, confusion = _confusion(gold, preds)
    if len(classes) > 2 or (len(classes) == 2 and 1 not in classes):
        raise ValueError(f"binary F1 needs class ids 0 / 1, got {classes.tolist()}")
    if 1 not in classes:
        return 0.0                            # no class 1 anywhere: 0 / 0, zero_division=0
    return float(_f1_per_class(confusion)[np.flatnonzero(classes == 1)[0]])


def macro_f1(gold, preds) -> float:
    """Unweighted mean of the per-class F1 over the classes present in gold or predictions."""
    return float(np.mean(_f1_per_class(_confusion(gold, preds)[1])))


def mcc(gold, preds) -> float:
    """Matthews correlation, the multi-class form from the confusion matrix (sklearn's
    matthews_corrcoef step by step); 0.0 when degenerate (one class in gold or predictions)."""
    confusion = _confusion(gold, preds)[1]
    t_sum = confusion.sum(axis=1, dtype=np.float64)
    p_sum = confusion.sum(axis=0, dtype=np.float64)
    n_correct = np.trace(confusion, dtype=np.float64)
    n_samples = p_sum.sum()
    cov_ytyp = n_correct * n_samples - np.dot(t_sum, p_sum)
    cov_ypyp = n_samples**2 - np.dot(p_sum, p_sum)
    cov_ytyt = n_samples**2 - np.dot(t_sum, t_sum)
    cov_ypyp_ytyt = cov_ypyp * cov_ytyt
    return 0.0 if cov_ypyp_ytyt == 0 else float(cov_ytyp / np.sqrt(cov_ypyp_ytyt))


def mse(gold, preds) -> float:
    """Mean squared error; NaN or inf in either array is an error, as sklearn's input check."""
    if not (np.isfinite(gold).all() and np.isfinite(preds).all()):
        raise ValueError("mse: predictions or labels contain NaN or infinity")
    return float(np.mean((gold - preds) ** 2))


def _constant(values: np.ndarray) -> bool:
    return bool(np.all(values == values[0]))


def pearson(x: np.ndarray, y: np.ndarray) -> float:
    """Pearson's r as scipy.stats.pearsonr computes it (1.17): centre, scale each side by its
    largest |deviation| before the norm (no premature overflow), dot the unit vectors, clip to
    [-1, 1], round n = 2 to exactly +-1. NaN for a constant side, as scipy (`_correlation` turns
    it into 0.0)."""
    if _constant(x) or _constant(y):
        return float("nan")
    with np.errstate(invalid="ignore", divide="ignore"):
        xm, ym = x - np.mean(x, keepdims=True), y - np.mean(y, keepdims=True)
        xmax, ymax = np.max(np.abs(xm), keepdims=True), np.max(np.abs(ym), keepdims=True)
        normxm = xmax * np.linalg.norm(xm / xmax, ord=2, axis=-1, keepdims=True)
        normym = ymax * np.linalg.norm(ym / ymax, ord=2, axis=-1, keepdims=True)
        # np.dot: the BLAS dot scipy's np.vecdot calls for 1-D float64 (numpy 1.x has no vecdot)
        r = np.clip(np.dot(xm / normxm, ym / normym), -1.0, 1.0)
    return float(np.round(r) if len(x) == 2 else r)


def average_ranks(values: np.ndarray) -> np.ndarray:
    """Ranks 1..n, ties sharing the mean of their ranks (scipy.stats.rankdata, "average")."""
    order = np.argsort(values, kind="mergesort")
    ordered = values[order]
    new = np.r_[True, ordered[1:] != ordered[:-1]]
    dense = np.empty(len(values), dtype=np.intp)
    dense[order] = np.cumsum(new)
    count = np.r_[np.flatnonzero(new), len(new)]
    return 0.5 * (count[dense] + count[dense - 1] + 1)


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rho as scipy.stats.spearmanr computes it: np.corrcoef of the two columns of
    average ranks. NaN when a side is constant or holds a NaN, as scipy."""
    if len(x) < 2 or _constant(x) or _constant(y) or np.isnan(x).any() or np.isnan(y).any():
        return float("nan")
    ranked = np.column_stack([average_ranks(x), average_ranks(y)])
    return float(np.corrcoef(ranked, rowvar=False)[1, 0])


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
    else:
        preds, gold = _class_ids(preds, "predictions"), _class_ids(gold, "labels")
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
