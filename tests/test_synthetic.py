"""Tests of kit.data.synthetic: the generated tasks and their ground-truth importance masks."""
import numpy as np
import pytest

from kit.data import synthetic
from kit.data.synthetic import COLOURS, DISTRACTORS, NEGATIONS, NEGATIVE, POSITIVE, generate


def polarity_label(words: list[str]) -> tuple[int, list[int]]:
    """Recompute (label, importance) of a single sentence from its words alone."""
    cues = [i for i, w in enumerate(words) if w in POSITIVE or w in NEGATIVE]
    assert len(cues) == 1, words
    at = cues[0]
    label = int(words[at] in POSITIVE)
    important = [0] * len(words)
    important[at] = 1
    if at > 0 and words[at - 1] in NEGATIONS:
        label = 1 - label
        important[at - 1] = 1
    return label, important


def test_word_lists_are_disjoint():
    groups = [set(POSITIVE), set(NEGATIVE), set(NEGATIONS), set(COLOURS), set(DISTRACTORS)]
    for i, a in enumerate(groups):
        for b in groups[i + 1:]:
            assert not a & b


@pytest.mark.parametrize("pair", [False, True])
@pytest.mark.parametrize("split", ["train", "dev", "test"])
def test_deterministic_per_split(pair, split):
    a, b = generate(pair, 50, split), generate(pair, 50, split)
    assert a.text_a == b.text_a and a.text_b == b.text_b and a.importance == b.importance
    np.testing.assert_array_equal(a.labels, b.labels)
    # a longer run starts with the same rows: the data does not depend on n
    longer = generate(pair, 80, split)
    assert longer.text_a[:50] == a.text_a[:50]


@pytest.mark.parametrize("pair", [False, True])
def test_splits_differ(pair):
    train, dev, test = (generate(pair, 100, s) for s in ("train", "dev", "test"))
    assert train.text_a != dev.text_a and dev.text_a != test.text_a and train.text_a != test.text_a
    # almost no sentence is shared between train and dev
    assert len(set(train.text_a) & set(dev.text_a)) <= 2


def test_single_and_pair_differ():
    single, pair = generate(False, 20, "train"), generate(True, 20, "train")
    assert single.text_b is None and pair.text_b is not None and len(pair.text_b) == 20
    assert single.text_a != pair.text_a


@pytest.mark.parametrize("pair", [False, True])
def test_split_shape_and_labels_balanced(pair):
    n = 1000
    split = generate(pair, n, "train")
    assert len(split) == n and len(split.ids) == n and len(split.importance) == n
    assert split.labels.dtype == np.int64 and split.labels.shape == (n,)
    assert set(np.unique(split.labels)) == {0, 1}
    assert 0.4 < split.labels.mean() < 0.6
    assert split.ids == [str(i) for i in range(n)]
    assert split.source == ("synthetic-pair:train" if pair else "synthetic:train")


@pytest.mark.parametrize("split_name", ["train", "dev"])
def test_single_sentence_label_and_importance_follow_from_the_words(split_name):
    split = generate(False, 600, split_name)
    n_negated = 0
    for text, importance, label in zip(split.text_a, split.importance, split.labels):
        words = text.split(" ")
        assert len(importance) == len(words)
        want_label, want_importance = polarity_label(words)
        assert label == want_label, text
        assert importance == want_importance, text
        assert 1 <= sum(importance) <= 2
        n_negated += sum(importance) == 2
        assert all(w in DISTRACTORS for w, imp in zip(words, importance) if not imp)
    assert 0.15 < n_negated / len(split) < 0.45   # negation is used, but not everywhere


def test_single_sentence_lengths_vary():
    split = generate(False, 300, "train")
    lengths = {len(t.split(" ")) for t in split.text_a}
    assert min(lengths) >= 6 and max(lengths) <= 13 and len(lengths) >= 5


@pytest.mark.parametrize("split_name", ["train", "dev"])
def test_pair_importance_marks_the_two_colours(split_name):
    split = generate(True, 600, split_name)
    for a, b, importance, label in zip(split.text_a, split.text_b, split.importance, split.labels):
        wa, wb = a.split(" "), b.split(" ")
        assert len(importance) == len(wa) + len(wb)
        words = wa + wb
        want = [int(w in COLOURS) for w in words]
        assert importance == want
        ca = [w for w in wa if w in COLOURS]
        cb = [w for w in wb if w in COLOURS]
        assert len(ca) == 1 and len(cb) == 1
        assert label == int(ca[0] == cb[0])
        assert all(w in DISTRACTORS for w in words if w not in COLOURS)


def test_subset_keeps_importance_aligned():
    split = generate(False, 40, "train")
    idx = [5, 0, 39, 12]
    sub = split.subset(idx)
    assert sub.text_a == [split.text_a[i] for i in idx]
    assert sub.importance == [split.importance[i] for i in idx]
    np.testing.assert_array_equal(sub.labels, split.labels[idx])
    assert sub.ids == ["5", "0", "39", "12"]


def test_unknown_split_rejected():
    with pytest.raises(KeyError):
        generate(False, 5, "validation")


def test_data_seed_is_fixed():
    assert synthetic.DATA_SEED == 1234


# ---------------------------------------------------------------- harder variants (mechanism benchmark)

def phi(a: np.ndarray, b: np.ndarray) -> float:
    """Phi (Pearson) correlation of two 0/1 vectors."""
    return float(np.corrcoef(a.astype(float), b.astype(float))[0, 1])


def has_spurious(split) -> np.ndarray:
    return np.array([synthetic.SPURIOUS in t.split(" ") for t in split.text_a])


def test_spurious_word_is_in_no_other_list():
    assert synthetic.SPURIOUS not in {*POSITIVE, *NEGATIVE, *NEGATIONS, *COLOURS, *DISTRACTORS}


@pytest.mark.parametrize("pair", [False, True])
def test_defaults_are_the_original_task(pair):
    """0 / 0 must give byte-identical data: earlier runs' results stay valid."""
    plain, hard = generate(pair, 200, "train"), generate(pair, 200, "train", 0.0, 0)
    assert plain.text_a == hard.text_a and plain.text_b == hard.text_b
    assert plain.importance == hard.importance
    np.testing.assert_array_equal(plain.labels, hard.labels)
    assert not has_spurious(plain).any()


@pytest.mark.parametrize("correlation", [0.5, 0.8, 1.0])
def test_spurious_word_correlates_with_the_label_in_train_only(correlation):
    train = generate(False, 4000, "train", spurious=correlation)
    dev = generate(False, 4000, "dev", spurious=correlation)
    assert abs(phi(has_spurious(train), train.labels) - correlation) < 0.04
    assert abs(phi(has_spurious(dev), dev.labels)) < 0.04
    assert 0.45 < has_spurious(dev).mean() < 0.55      # present in dev too, by a fair coin
    if correlation == 1.0:                              # a perfect shortcut in train
        np.testing.assert_array_equal(has_spurious(train), train.labels.astype(bool))


def test_spurious_present_rule():
    """correlation 1: present exactly when label 1; 0: a fair coin whatever the label."""
    rng = np.random.default_rng(0)
    assert all(synthetic.spurious_present(rng, label, 1.0) == bool(label) for label in (0, 1) * 20)
    draws = [synthetic.spurious_present(rng, 1, 0.0) for _ in range(2000)]
    assert 0.45 < np.mean(draws) < 0.55


@pytest.mark.parametrize("split_name", ["train", "dev"])
def test_spurious_variant_importance_marks_only_the_cue(split_name):
    split = generate(False, 600, split_name, spurious=0.9)
    for text, importance, label in zip(split.text_a, split.importance, split.labels):
        words = text.split(" ")
        assert words.count(synthetic.SPURIOUS) <= 1
        rest = [w for w in words if w != synthetic.SPURIOUS]
        kept = [imp for w, imp in zip(words, importance) if w != synthetic.SPURIOUS]
        want_label, want_importance = polarity_label(rest)
        assert label == want_label and kept == want_importance, text
        assert all(imp == 0 for w, imp in zip(words, importance) if w == synthetic.SPURIOUS)
        assert all(w in (POSITIVE + NEGATIVE + NEGATIONS) for w, imp in zip(words, importance) if imp)


def test_spurious_pair_goes_into_text_a_with_aligned_importance():
    split = generate(True, 300, "train", spurious=1.0)
    for a, b, importance, label in zip(split.text_a, split.text_b, split.importance, split.labels):
        words = a.split(" ") + b.split(" ")
        assert importance == [int(w in COLOURS) for w in words]
        assert (synthetic.SPURIOUS in a.split(" ")) == bool(label)
        assert synthetic.SPURIOUS not in b.split(" ")


@pytest.mark.parametrize("pair", [False, True])
def test_distractor_count(pair):
    n = 16
    split = generate(pair, 400, "train", distractors=n)
    sides = [split.text_a] + ([split.text_b] if pair else [])
    counts = [sum(w in DISTRACTORS for w in t.split(" ")) for side in sides for t in side]
    assert min(counts) == n - 3 and max(counts) == n + 3
    one = generate(pair, 400, "train", distractors=1)
    counts = [sum(w in DISTRACTORS for w in t.split(" ")) for t in one.text_a]
    assert min(counts) == 1 and max(counts) == 4
    if not pair:       # labels and masks still follow from the words
        for text, importance, label in zip(split.text_a, split.importance, split.labels):
            assert (label, importance) == polarity_label(text.split(" "))


def test_run_config_fields_reach_the_generator():
    from kit.config.run_config import ConfigError, RunConfig
    from kit.data.pipeline import load_task_data
    data = load_task_data(RunConfig(task="synthetic", synthetic_size=400, synthetic_spurious=1.0,
                                    synthetic_distractors=20))
    np.testing.assert_array_equal(has_spurious(data.train), data.train.labels.astype(bool))
    assert abs(phi(has_spurious(data.dev["dev"]), data.dev["dev"].labels)) < 0.3
    assert min(len(t.split(" ")) for t in data.train.text_a) >= 17 + 1
    # the defaults leave the run id alone: no new field enters it unless set
    assert RunConfig(synthetic_spurious=0.0, synthetic_distractors=0).run_id == RunConfig().run_id
    assert RunConfig(synthetic_spurious=0.5).run_id != RunConfig().run_id
    for bad in (dict(synthetic_spurious=1.5), dict(synthetic_distractors=-1)):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            RunConfig(**bad)


# ---------------------------------------------------------------- SSA labels against the true mask

def test_label_precision_recall_by_hand():
    from kit.methods.ssa import label_precision_recall
    labels = np.array([1, 1, 1, 0, 0, 1, 0])
    truth = np.array([1, 0, 1, 1, 0, 0, 0])
    # labelled 1: positions 0, 1, 2, 5 -> cues at 0, 2: precision 2/4; cues 0, 2, 3 -> 2/3
    assert label_precision_recall(labels, truth) == (0.5, 2 / 3)
    assert label_precision_recall(np.zeros(3, int), np.ones(3, int)) == (None, 0.0)
    assert label_precision_recall(np.ones(2, int), np.zeros(2, int)) == (0.0, None)


def test_label_stats_carry_precision_and_recall():
    from kit.data.pipeline import IGNORE, Examples
    from kit.methods.ssa import LabelStats
    ssa = Examples(input_ids=[np.arange(5), np.arange(4)], token_type_ids=None,
                   special=[np.zeros(5, bool), np.zeros(4, bool)], labels=np.array([0, 1]),
                   ssa_labels=[np.array([IGNORE, 1, 0, 1, IGNORE]), np.array([1, IGNORE, 0, 0])],
                   importance=[np.array([1, 1, 0, 0, 0]), np.array([0, 0, 1, 1])])
    stats = LabelStats(epoch=1, rule="paper").finish(ssa, started=0.0)
    # labelled (label, cue): (1,1) (0,0) (1,0) | (1,0) (0,1) (0,1): label 1 on 3 tokens, 1 a cue;
    # 3 labelled cues, 1 labelled 1
    assert stats.label1_precision == 1 / 3 and stats.label1_recall == 1 / 3
    assert stats.cue_share_label1 == stats.label1_recall
    assert stats.distractor_share_label1 == 2 / 3
