"""Tests of kit.synthetic: the generated tasks and their ground-truth importance masks."""
import numpy as np
import pytest

from kit import synthetic
from kit.synthetic import COLOURS, DISTRACTORS, NEGATIONS, NEGATIVE, POSITIVE, generate


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
