"""The SSA mechanism benchmark's tables (kit.results.figures.mechanism) on hand-made runs with known
answers, and kit.runs' reader of the saved SSA labels. The notebook itself runs in
test_paper_outputs."""
import time

import numpy as np
import pandas as pd
import pytest

from kit.results.figures import mechanism
from kit import runs
from kit.data.pipeline import IGNORE, Examples
from kit.methods.ssa import LabelStats
from kit.data.synthetic import SPURIOUS


def run_rows(method, last, heldout, **config):
    """One hand-made collect_runs row per seed: last and held-out epoch scores."""
    return [{"run_id": f"{method}-{len(config)}-{seed}", "status": "ok", "error": None,
             "model": "tiny", "task": "synthetic", "method": method, "seed": seed,
             "score": max(l, h), "last_score": l, "heldout_score": h,
             "guide_loss": config.get("guide_loss", "task"),
             "budget": config.get("budget", "epochs")}
            for seed, (l, h) in enumerate(zip(last, heldout))]


@pytest.fixture
def benchmark():
    return pd.DataFrame([
        *run_rows("bert", [0.50, 0.60, 0.70], [0.55, 0.60, 0.65]),
        *run_rows("bert", [0.30, 0.40, 0.50], [0.30, 0.40, 0.50], guide_loss="task+both"),
        *run_rows("ssa-h", [0.70, 0.60, 0.80], [0.70, 0.70, 0.70]),
        *run_rows("bert-mask", [0.80, 0.90, 1.00], [0.80, 0.90, 0.95]),
        *run_rows("bert-mask", [0.40, 0.50, 0.60], [0.45, 0.50, 0.55], budget="equal_steps"),
        {**run_rows("ssa-h", [0.1], [0.1])[0], "seed": 9, "status": "failed"}])


def test_accuracy_table(benchmark):
    table = mechanism.accuracy_table(benchmark)
    assert list(table.columns) == [
        "method", "n", "last", "last diff", "last p_holm Welch", "last p_holm perm.",
        "heldout", "heldout diff", "heldout p_holm Welch", "heldout p_holm perm."]
    # Welch p against BERT-r (last): BERT-mask 0.0213, eq. steps 0.2879, SSA-H 0.2879, guiding
    # 0.0705; Holm x4, x3, x2, x2. Permutation, 3 vs 3 seeds: at least 2/20 = 0.1 before Holm
    assert table.values.tolist() == [
        ["BERT-r", 3, "60.0 ± 10.0", "", "", "", "60.0 ± 5.0", "", "", ""],
        ["BERT-mask", 3, "90.0 ± 10.0", "+30.0", "0.085", "0.400",
         "88.3 ± 7.6", "+28.3", "0.035*", "0.400"],
        ["BERT-mask eq. steps", 3, "50.0 ± 10.0", "-10.0", "0.576", "1.000",
         "50.0 ± 5.0", "-10.0", "0.164", "0.400"],
        ["SSA-H", 3, "70.0 ± 10.0", "+10.0", "0.576", "1.000",
         "70.0 ± 0.0", "+10.0", "0.164", "0.400"],
        ["BERT-r + guiding", 3, "40.0 ± 10.0", "-20.0", "0.211", "0.600",
         "40.0 ± 10.0", "-20.0", "0.164", "0.400"]]
    assert "across the 4 comparisons" in table.attrs["caption"]


def test_benchmark_runs_and_figure_frames(benchmark):
    bench = mechanism.benchmark_runs(benchmark)
    assert len(bench) == 15                                  # the failed run is left out
    assert list(dict.fromkeys(bench.sort_values("row_rank", kind="stable")["method"])) == [
        "bert", "bert-mask", "BERT-mask eq. steps", "ssa-h", "BERT-r + guiding"]
    scores = mechanism.figure_scores(benchmark)
    assert list(scores.columns) == ["method", "seed", "score"]
    assert scores.groupby("method")["score"].sum().round(6).to_dict() == {
        "BERT-mask eq. steps": 1.5, "BERT-r + guiding": 1.2, "bert": 1.8, "bert-mask": 2.7,
        "ssa-h": 2.1}
    title = mechanism.figure_title(benchmark.assign(max_train_examples=300,
                                                    synthetic_spurious=0.8))
    assert title == "synthetic, 300 rows, shortcut phi 0.8 (train) / 0 (dev), tiny"
    two = pd.concat([benchmark, benchmark.assign(model="minilm")])
    with pytest.raises(ValueError, match="one model x task at a time, got 2"):
        mechanism.accuracy_table(two)


SHORTCUT = 7


def examples(*rows):
    """Examples from (ids, ssa labels, importance) rows; 0 / 101 / 102 ids as [CLS] / [SEP]."""
    ids, labels, importance = zip(*rows)
    arrays = lambda rows: [np.array(r, np.int64) for r in rows]  # noqa: E731
    return Examples(arrays(ids), None, [np.isin(r, (101, 102)) for r in arrays(ids)],
                    np.zeros(len(rows), np.int64), arrays(labels), arrays(importance))


def save_epoch(run_dir, epoch, epoch_set, flipped=1, variants=4):
    """What kit.methods.epochs.build_epoch saves with save_labels: true."""
    stats = LabelStats(epoch=epoch, rule="paper", flipped=flipped, variants=variants)
    stats.finish(epoch_set, time.perf_counter())
    runs.write_saved_labels(run_dir, epoch, vars(epoch_set), stats.to_dict())


X = IGNORE
# labelled tokens: a cue labelled 1, the shortcut labelled 1, a distractor labelled 0; the
# shortcut labelled 0 and a cue labelled 1: precision 2/3, recall 1, distractors 1/3,
# chance 2/5 (cues among labelled), shortcut 1/2
MIXED = examples(([101, 5, SHORTCUT, 9, 102], [X, 1, 1, 0, X], [0, 1, 0, 0, 0]),
                 ([101, SHORTCUT, 6, 102], [X, 0, 1, X], [0, 0, 1, 0]))
# the cue labelled 0, the shortcut 1: precision 0, recall 0, distractors 1/2, chance 1/3,
# shortcut 1
SHORTCUT_ONLY = examples(([101, SHORTCUT, 5, 9, 102], [X, 1, 0, 0, X], [0, 0, 1, 0, 0]),)


@pytest.fixture
def label_runs(tmp_path):
    frame = []
    for method, seed, epochs in (("ssa-h", 0, {1: MIXED, 2: MIXED}),
                                 ("ssa-h", 1, {1: SHORTCUT_ONLY}),
                                 ("ssa-co", 0, {1: SHORTCUT_ONLY}), ("bert", 0, {})):
        run_dir = tmp_path / f"{method}-{seed}"
        for epoch, epoch_set in epochs.items():
            save_epoch(run_dir, epoch, epoch_set, flipped=seed + 1)
        frame.append({"status": "ok", "model": "tiny", "task": "synthetic", "method": method,
                      "seed": seed, "run_dir": str(run_dir)})
    return pd.DataFrame(frame)


def test_label_records_count_the_saved_epochs(label_runs):
    records = mechanism.label_records(label_runs, shortcut_id=SHORTCUT)
    assert records.round(4).values.tolist() == [
        ["ssa-h", 0, 1, 0.6667, 1.0, 0.3333, 0.25, 0.4, 0.5],
        ["ssa-h", 0, 2, 0.6667, 1.0, 0.3333, 0.25, 0.4, 0.5],
        ["ssa-h", 1, 1, 0.0, 0.0, 0.5, 0.5, 0.3333, 1.0],
        ["ssa-co", 0, 1, 0.0, 0.0, 0.5, 0.25, 0.3333, 1.0]]
    assert list(records.columns) == [
        "method", "seed", "epoch", "label1_precision", "label1_recall",
        "distractor_share_label1", "flip_rate", "chance_precision", "shortcut_share_label1"]


def test_label_table(label_runs):
    table = mechanism.label_table(mechanism.label_records(label_runs, shortcut_id=SHORTCUT))
    assert table.values.tolist() == [                   # SSA-Co first: the registry's order
        ["SSA-Co, epoch 2", "0.00", "0.33", "0.00", "0.50", "1.00", "0.25"],   # from 1
        ["SSA-H, epoch 2", "0.33 ± 0.47", "0.37 ± 0.05", "0.50 ± 0.71", "0.42 ± 0.12",
         "0.75 ± 0.35", "0.38 ± 0.18"],
        ["SSA-H, epoch 3", "0.67", "0.40", "1.00", "0.33", "0.50", "0.25"]]
    assert list(table.columns) == ["SSA labels", "precision", "chance", "recall",
                                   "distractors labelled 1", "shortcut labelled 1", "flip rate"]
    assert "shortcut word 'zebra'" in table.attrs["caption"]


def test_label_records_need_saved_labels(label_runs):
    with pytest.raises(ValueError, match="no saved SSA labels"):
        mechanism.label_records(label_runs[label_runs["method"] == "bert"])


def test_shortcut_word_is_one_word_piece_of_the_embedded_vocabulary():
    from kit.models.backbones import load_tokenizer
    assert mechanism.shortcut_token_id("tiny") == load_tokenizer("tiny").vocab[SPURIOUS]


def test_read_saved_labels_in_epoch_order(tmp_path):
    for epoch in (10, 2, 1):
        save_epoch(tmp_path, epoch, MIXED)
    assert [blob["stats"]["epoch"] for blob in runs.read_saved_labels(tmp_path)] == [1, 2, 10]
    blob = next(runs.read_saved_labels(tmp_path))
    assert blob["epoch_set"]["ssa_labels"][1].tolist() == [X, 0, 1, X]
    assert list(runs.read_saved_labels(tmp_path / "nothing")) == []
