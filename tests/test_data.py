"""Tests of kit.data.pipeline: tokenization, word -> word-piece importance, collation, batching, loading."""
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from kit.data import pipeline as data, synthetic, token_cache
from kit.models.backbones import load_tokenizer
from kit.config.run_config import RunConfig
from kit.data.pipeline import (IGNORE, Examples, encode, length_grouped_batches, load_task_data,
                               random_batches, sorted_batches)
from kit.data.tensors import collate
from kit.data.readers import DataError, read_glue_split
from kit.config.tasks import Split, get_task


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("minilm")


def make_split(a, b=None, labels=None, importance=None):
    return Split(text_a=list(a), text_b=None if b is None else list(b),
                 labels=None if labels is None else np.asarray(labels),
                 ids=[str(i) for i in range(len(a))], source="test", importance=importance)


SINGLE = ["a good movie", "the plot was thin and the actors were bored", "wow"]
PAIR_B = ["it is fine", "nothing", "a very long second sentence with many words in it"]


# --------------------------------------------------------------------------- encode

def test_encode_single(tok):
    ex = encode(tok, make_split(SINGLE, labels=[1, 0, 1]), 128, regression=False)
    assert len(ex) == 3 and ex.labels.dtype == np.int64
    np.testing.assert_array_equal(ex.labels, [1, 0, 1])
    for ids, special, text in zip(ex.input_ids, ex.special, SINGLE):
        assert ids.dtype == np.int64 and special.dtype == bool and len(ids) == len(special)
        assert ids[0] == tok.cls_token_id and ids[-1] == tok.sep_token_id
        np.testing.assert_array_equal(special, np.isin(ids, [tok.cls_token_id, tok.sep_token_id]))
        assert special.sum() == 2
        assert tok.decode(ids[~special]) == text
    np.testing.assert_array_equal(ex.lengths, [len(x) for x in ex.input_ids])
    assert ex.ssa_labels is None and ex.importance is None


def test_encode_pair_has_token_types(tok):
    ex = encode(tok, make_split(SINGLE, PAIR_B, labels=[0, 1, 1]), 128, regression=False)
    assert ex.token_type_ids is not None
    for ids, types, special, a, b in zip(ex.input_ids, ex.token_type_ids, ex.special, SINGLE,
                                         PAIR_B):
        seps = np.flatnonzero(ids == tok.sep_token_id)
        assert len(seps) == 2 and seps[1] == len(ids) - 1
        assert special.sum() == 3 and special[0] and special[seps].all()
        np.testing.assert_array_equal(types[: seps[0] + 1], 0)
        np.testing.assert_array_equal(types[seps[0] + 1:], 1)
        assert tok.decode(ids[1:seps[0]]) == a and tok.decode(ids[seps[0] + 1:-1]) == b


def test_encode_regression_and_unlabelled(tok):
    ex = encode(tok, make_split(SINGLE, labels=[0.5, 4.25, 1.0]), 128, regression=True)
    assert ex.labels.dtype == np.float32
    np.testing.assert_allclose(ex.labels, [0.5, 4.25, 1.0])
    ex = encode(tok, make_split(SINGLE), 128, regression=False)
    assert ex.labels.dtype == np.int64 and (ex.labels == 0).all()
    ex = encode(tok, make_split(SINGLE), 128, regression=True)
    assert ex.labels.dtype == np.float32 and len(ex.labels) == 3


@pytest.mark.parametrize("max_length", [8, 12, 20])
def test_encode_truncates(tok, max_length):
    long_a = " ".join(["movie"] * 40)
    long_b = " ".join(["river"] * 30)
    single = encode(tok, make_split([long_a, "short"]), max_length, False)
    assert len(single.input_ids[0]) == max_length and single.input_ids[0][-1] == tok.sep_token_id
    assert len(single.input_ids[1]) == 3
    pair = encode(tok, make_split([long_a, "short"], [long_b, long_b]), max_length, False)
    for ids, types, special in zip(pair.input_ids, pair.token_type_ids, pair.special):
        assert len(ids) == max_length and len(types) == max_length
        assert special.sum() == 3 and ids[-1] == tok.sep_token_id
        assert (types == 1).any() and (types == 0).any()   # both sides survive truncation
    # longest-first: the long pair gets (nearly) equal shares
    ids0 = pair.input_ids[0]
    n_a, n_b = (ids0 == tok.convert_tokens_to_ids("movie")).sum(), (ids0 == tok.convert_tokens_to_ids("river")).sum()
    assert abs(int(n_a) - int(n_b)) <= 1


# --------------------------------------------------------------------------- importance

def test_token_importance_single_synthetic(tok):
    split = synthetic.generate(False, 200, "train")
    ex = encode(tok, split, 128, False)
    assert ex.importance is not None and len(ex.importance) == len(split)
    cues = set(synthetic.POSITIVE) | set(synthetic.NEGATIVE) | set(synthetic.NEGATIONS)
    for ids, imp, special, word_imp in zip(ex.input_ids, ex.importance, ex.special,
                                            split.importance):
        assert len(imp) == len(ids) and set(np.unique(imp)) <= {0, 1}
        assert (imp[special] == 0).all()
        tokens = tok.convert_ids_to_tokens(ids.tolist())
        flagged = [t for t, i in zip(tokens, imp) if i]
        assert flagged and all(t in cues for t in flagged)
        assert all(t not in cues for t, i in zip(tokens, imp) if not i)
        assert imp.sum() == sum(word_imp)          # whole words: one piece per word


def test_token_importance_pair_synthetic(tok):
    split = synthetic.generate(True, 200, "dev")
    ex = encode(tok, split, 128, False)
    for ids, types, imp, special in zip(ex.input_ids, ex.token_type_ids, ex.importance,
                                        ex.special):
        assert (imp[special] == 0).all()
        tokens = tok.convert_ids_to_tokens(ids.tolist())
        assert [t for t, i in zip(tokens, imp) if i] == [t for t in tokens
                                                          if t in synthetic.COLOURS]
        assert imp.sum() == 2
        assert sorted(types[imp == 1].tolist()) == [0, 1]   # one colour on each side


def test_token_importance_spreads_over_word_pieces(tok):
    """A multi-piece word flags all its pieces; text_b word indices follow text_a's."""
    word = "unbelievability"
    assert len(tok.tokenize(word)) > 1
    split = make_split(["the " + word + " here"], ["some " + word],
                       labels=[1], importance=[[0, 1, 0, 0, 1]])
    ex = encode(tok, split, 64, False)
    tokens = tok.convert_ids_to_tokens(ex.input_ids[0].tolist())
    pieces = tok.tokenize(word)
    want = ([0, 0] + [1] * len(pieces) + [0, 0]        # [CLS] the <word> here [SEP]
            + [0] + [1] * len(pieces) + [0])           # some <word> [SEP]
    assert len(tokens) == len(want)
    np.testing.assert_array_equal(ex.importance[0], want)


@pytest.mark.parametrize("pair", [False, True])
def test_token_importance_under_truncation(tok, pair):
    split = synthetic.generate(pair, 100, "train")
    ex = encode(tok, split, 8, False)
    for ids, imp, special in zip(ex.input_ids, ex.importance, ex.special):
        assert len(ids) <= 8 and len(imp) == len(ids) and (imp[special] == 0).all()


# --------------------------------------------------------------------------- collate

def test_collate_pads_to_longest(tok):
    ex = encode(tok, make_split(SINGLE, PAIR_B, labels=[0, 1, 1]), 128, False)
    ssa = [np.where(s, IGNORE, np.arange(len(s)) % 2) for s in ex.special]
    ex = ex.with_ssa_labels(ssa)
    pad = 7777
    for idx in ([2, 0, 1], [1], [0, 2]):
        batch = collate(ex, idx, pad)
        width = max(len(ex.input_ids[i]) for i in idx)
        assert batch["input_ids"].shape == (len(idx), width)
        for name in ("attention_mask", "special_mask", "token_type_ids", "ssa_labels"):
            assert batch[name].shape == (len(idx), width), name
        assert batch["special_mask"].dtype == torch.bool
        assert torch.equal(batch["rows"], torch.tensor(idx))
        assert torch.equal(batch["labels"], torch.from_numpy(ex.labels[idx]))
        for j, i in enumerate(idx):
            n = len(ex.input_ids[i])
            assert batch["input_ids"][j, :n].tolist() == ex.input_ids[i].tolist()
            assert (batch["input_ids"][j, n:] == pad).all()
            assert (batch["attention_mask"][j, :n] == 1).all()
            assert (batch["attention_mask"][j, n:] == 0).all()
            assert batch["special_mask"][j, :n].tolist() == ex.special[i].tolist()
            assert batch["special_mask"][j, n:].all()
            assert batch["token_type_ids"][j, :n].tolist() == ex.token_type_ids[i].tolist()
            assert (batch["token_type_ids"][j, n:] == 0).all()
            assert batch["ssa_labels"][j, :n].tolist() == ssa[i].tolist()
            assert (batch["ssa_labels"][j, n:] == IGNORE).all()


def test_collate_without_optional_fields():
    ex = Examples([np.array([1, 5, 2]), np.array([1, 2])], None,
                  [np.array([1, 0, 1], bool), np.array([1, 1], bool)], np.array([0.5, 1.5], np.float32))
    batch = collate(ex, [1, 0], 0)
    assert "token_type_ids" not in batch and "ssa_labels" not in batch
    assert batch["input_ids"].tolist() == [[1, 2, 0], [1, 5, 2]]
    assert batch["labels"].dtype == torch.float32


def reference_padding(rows, fill, dtype) -> torch.Tensor:
    """The plain definition: each row as a list, `fill` appended up to the longest row."""
    width = max(len(r) for r in rows)
    return torch.tensor([[*r.tolist(), *[fill] * (width - len(r))] for r in rows], dtype=dtype)


@st.composite
def ragged_batch(draw):
    """Random ragged rows (1-12 tokens, int32 or int64 source arrays), optional token types and
    SSA labels, class or regression labels, and a batch of row indices (any order, repeats)."""
    n = draw(st.integers(1, 8))
    lengths = draw(st.lists(st.integers(1, 12), min_size=n, max_size=n))
    int_dtype = draw(st.sampled_from([np.int32, np.int64]))

    def rows(dtype, elements):
        return [draw(hnp.arrays(dtype, k, elements=elements)) for k in lengths]

    labels = (hnp.arrays(np.float32, n, elements=st.floats(-5, 5, width=32)) if draw(st.booleans())
              else hnp.arrays(np.int64, n, elements=st.integers(0, 4)))
    ex = Examples(rows(int_dtype, st.integers(0, 2**31 - 1)),
                  rows(int_dtype, st.integers(0, 1)) if draw(st.booleans()) else None,
                  rows(np.bool_, st.booleans()), draw(labels),
                  rows(int_dtype, st.sampled_from([IGNORE, 0, 1])) if draw(st.booleans()) else None)
    idx = draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=10))
    return ex, idx, draw(st.integers(0, 2**31 - 1))


@settings(max_examples=200)
@given(ragged_batch())
def test_collate_is_plain_padding(case):
    ex, idx, pad_id = case
    batch = collate(ex, idx, pad_id)
    want = {"input_ids": reference_padding([ex.input_ids[i] for i in idx], pad_id, torch.int64),
            "attention_mask": reference_padding([np.ones(len(ex.input_ids[i])) for i in idx], 0,
                                                torch.int64),
            "special_mask": reference_padding([ex.special[i] for i in idx], True, torch.bool),
            "labels": torch.from_numpy(ex.labels[idx]), "rows": torch.tensor(idx)}
    if ex.token_type_ids is not None:
        want["token_type_ids"] = reference_padding([ex.token_type_ids[i] for i in idx], 0,
                                                   torch.int64)
    if ex.ssa_labels is not None:
        want["ssa_labels"] = reference_padding([ex.ssa_labels[i] for i in idx], IGNORE,
                                               torch.int64)
    assert batch.keys() == want.keys()
    for name, tensor in want.items():
        assert batch[name].dtype == tensor.dtype and torch.equal(batch[name], tensor), name


# --------------------------------------------------------------------------- batching

def check_partition(batches, n, batch_size):
    flat = [i for b in batches for i in b]
    assert sorted(flat) == list(range(n))
    assert all(1 <= len(b) <= batch_size for b in batches)


def test_length_grouped_batches_property():
    rng = np.random.default_rng(0)
    for _ in range(25):
        n = int(rng.integers(1, 700))
        batch_size = int(rng.integers(1, 40))
        megabatch = int(rng.integers(1, 8))
        lengths = rng.integers(3, 128, size=n)
        seed = int(rng.integers(1000))
        a = length_grouped_batches(lengths, batch_size, np.random.default_rng(seed), megabatch)
        b = length_grouped_batches(lengths, batch_size, np.random.default_rng(seed), megabatch)
        assert a == b
        check_partition(a, n, batch_size)
        # only the last batch of each mega-batch may be short
        n_chunks = -(-n // (batch_size * megabatch))
        assert sum(len(x) < batch_size for x in a) <= n_chunks
        # inside a batch lengths are sorted longest first
        assert all((np.diff(lengths[x]) <= 0).all() for x in a)
    lengths = np.arange(500) % 97
    one = length_grouped_batches(lengths, 8, np.random.default_rng(1))
    two = length_grouped_batches(lengths, 8, np.random.default_rng(2))
    assert one != two


def test_random_and_sorted_batches_partition():
    rng = np.random.default_rng(3)
    for _ in range(20):
        n, batch_size = int(rng.integers(1, 300)), int(rng.integers(1, 33))
        lengths = rng.integers(1, 60, size=n)
        check_partition(random_batches(n, batch_size, np.random.default_rng(0)), n, batch_size)
        assert random_batches(n, batch_size, np.random.default_rng(5)) == \
            random_batches(n, batch_size, np.random.default_rng(5))
        s = sorted_batches(lengths, batch_size)
        check_partition(s, n, batch_size)
        flat = lengths[[i for b in s for i in b]]
        assert (np.diff(flat) <= 0).all()                 # longest first, across batches too
        assert lengths[s[0][0]] == lengths.max()
        assert all(len(b) == batch_size for b in s[:-1])


def padding_efficiency(lengths, batches):
    return lengths.sum() / sum(len(b) * lengths[b].max() for b in batches)


def test_length_grouping_removes_padding_on_sst2(tok, glue_dir):
    train = read_glue_split(get_task("SST-2"), "train", glue_dir)
    pick = np.sort(np.random.default_rng(0).choice(len(train), 3000, replace=False))
    lengths = encode(tok, train.subset(pick), 128, False).lengths
    assert lengths.max() > 3 * np.median(lengths)        # a skewed real length distribution
    for seed in range(3):
        grouped = padding_efficiency(lengths, length_grouped_batches(
            lengths, 32, np.random.default_rng(seed)))
        shuffled = padding_efficiency(lengths, random_batches(len(lengths), 32,
                                                              np.random.default_rng(seed)))
        assert grouped > 0.9, grouped
        assert shuffled < 0.6 and grouped > shuffled + 0.3, (grouped, shuffled)
    assert padding_efficiency(lengths, sorted_batches(lengths, 32)) > 0.95


# --------------------------------------------------------------------------- Examples

def make_examples(n, seed, with_ssa):
    rng = np.random.default_rng(seed)
    ids = [rng.integers(100, 200, size=int(rng.integers(3, 9))) for _ in range(n)]
    special = [np.r_[True, np.zeros(len(x) - 2, bool), True] for x in ids]
    ssa = [rng.integers(0, 2, size=len(x)) for x in ids] if with_ssa else None
    return Examples(ids, [np.zeros(len(x), np.int64) for x in ids], special,
                    rng.integers(0, 3, size=n), ssa_labels=ssa)


def test_examples_subset():
    ex = make_examples(10, 0, True)
    idx = [7, 2, 2, 9]
    sub = ex.subset(idx)
    assert len(sub) == 4
    np.testing.assert_array_equal(sub.labels, ex.labels[idx])
    for j, i in enumerate(idx):
        assert sub.input_ids[j] is ex.input_ids[i] and sub.ssa_labels[j] is ex.ssa_labels[i]
        assert sub.special[j] is ex.special[i] and sub.token_type_ids[j] is ex.token_type_ids[i]
    np.testing.assert_array_equal(sub.lengths, ex.lengths[idx])
    assert sub.importance is None


def test_examples_concat_fills_missing_ssa_labels():
    a, b = make_examples(4, 1, True), make_examples(3, 2, False)
    both = Examples.concat([a, b])
    assert len(both) == 7
    np.testing.assert_array_equal(both.labels, np.r_[a.labels, b.labels])
    np.testing.assert_array_equal(both.lengths, np.r_[a.lengths, b.lengths])
    for i in range(4):
        np.testing.assert_array_equal(both.ssa_labels[i], a.ssa_labels[i])
    for i in range(3):
        got = both.ssa_labels[4 + i]
        assert len(got) == len(b.input_ids[i]) and (got == IGNORE).all()
    assert len(both.token_type_ids) == 7 and len(both.special) == 7
    assert both.importance is None
    assert Examples.concat([b, b]).ssa_labels is None
    # order matters: labelled part second
    flipped = Examples.concat([b, a])
    assert (flipped.ssa_labels[0] == IGNORE).all()
    np.testing.assert_array_equal(flipped.ssa_labels[3], a.ssa_labels[0])


# --------------------------------------------------------------------------- loading

def test_cap_is_the_same_subset_for_every_seed():
    train = synthetic.generate(False, 300, "train")
    picks = [load_task_data(RunConfig(task="synthetic", synthetic_size=300, seed=s,
                                      max_train_examples=40)).train.ids for s in range(5)]
    assert all(p == picks[0] for p in picks) and len(picks[0]) == 40
    assert picks[0] == data._cap(train, 40).ids
    assert picks[0] == sorted(picks[0], key=int)        # kept in file order
    assert picks[0] != [str(i) for i in range(40)]      # but not simply the first rows
    assert data._cap(train, 0) is train
    assert data._cap(train, 300) is train
    assert data._cap(train, 5000) is train
    capped = data._cap(train, 40)
    for i, row in enumerate(int(x) for x in capped.ids):
        assert capped.text_a[i] == train.text_a[row]
        assert capped.importance[i] == train.importance[row]
        assert capped.labels[i] == train.labels[row]


@pytest.mark.parametrize("task, size", [("synthetic", 200), ("synthetic-pair", 40), ("synthetic", 8)])
def test_load_synthetic(task, size):
    td = load_task_data(RunConfig(task=task, synthetic_size=size))
    assert td.task.name == task and td.task.kind == "synthetic"
    assert len(td.train) == size and list(td.dev) == ["dev"] and td.test == {}
    assert len(td.dev["dev"]) == max(size // 4, 8)
    assert (td.train.text_b is not None) == (task == "synthetic-pair")
    assert td.train.importance is not None and td.dev["dev"].importance is not None
    capped = load_task_data(RunConfig(task=task, synthetic_size=size, max_train_examples=6))
    assert len(capped.train) == 6 and len(capped.dev["dev"]) == len(td.dev["dev"])


def test_load_rte_from_glue_dir(glue_dir):
    td = load_task_data(RunConfig(task="rte", glue_dir=str(glue_dir)))
    assert td.task.name == "RTE" and td.task.is_pair
    assert len(td.train) == 2490 and list(td.dev) == ["dev"] and len(td.dev["dev"]) == 277
    assert td.test == {}
    assert td.train.text_b is not None and set(np.unique(td.train.labels)) == {0, 1}
    capped = load_task_data(RunConfig(task="RTE", glue_dir=str(glue_dir), max_train_examples=100,
                                      predict_test=True))
    assert len(capped.train) == 100 and list(capped.test) == ["test"]
    assert capped.test["test"].labels is None and len(capped.test["test"]) == 3000


def test_missing_glue_folder_names_the_path(tmp_path):
    missing = tmp_path / "no_glue_here"
    with pytest.raises(DataError) as info:
        load_task_data(RunConfig(task="RTE", glue_dir=str(missing)))
    assert str(missing) in str(info.value) and "\n" not in str(info.value)
    # a folder without the task: the task is read from the next source that holds it
    assert load_task_data(RunConfig(task="RTE", glue_dir=str(tmp_path))).train.source == str(
        data.PROJECT_GLUE / "RTE" / "train.tsv")


def rte_copy(folder: Path, splits=("dev", "test")) -> Path:
    """folder/RTE/ holding the project's RTE files of `splits`."""
    (folder / "RTE").mkdir(parents=True, exist_ok=True)
    for split in splits:
        (folder / "RTE" / f"{split}.tsv").write_bytes(
            (data.PROJECT_GLUE / "RTE" / f"{split}.tsv").read_bytes())
    return folder / "RTE"


def test_a_glue_dir_task_without_train_is_one_line_never_the_projects_copy(tmp_path, monkeypatch):
    """A user's RTE/ without train.tsv (or with a folder of that name) is named, never read
    from data/glue instead: an edited copy would silently train on the original."""
    rte = rte_copy(tmp_path)
    monkeypatch.setenv("GLUE_DIR", str(tmp_path))
    tail = (f"; a run of RTE reads train.tsv, dev.tsv there and from no other copy: add them "
            f"(./run_all.sh fetch RTE --glue-dir {tmp_path}) or move {rte} away")
    with pytest.raises(DataError) as info:
        load_task_data(RunConfig(task="RTE"))
    assert str(info.value) == f"GLUE_DIR={tmp_path}: {rte / 'train.tsv'} (absent)" + tail
    (rte / "train.tsv").mkdir()
    with pytest.raises(DataError) as info:
        load_task_data(RunConfig(task="rte", glue_dir=str(tmp_path)))
    assert str(info.value) == f"glue_dir={tmp_path}: {rte / 'train.tsv'} (not a file)" + tail
    (rte / "train.tsv").rmdir()
    (rte / "dev.tsv").unlink()
    with pytest.raises(DataError) as info:
        data.glue_source("", "RTE")
    assert str(info.value).startswith(
        f"GLUE_DIR={tmp_path}: {rte}/: train.tsv (absent), dev.tsv (absent); a run of RTE")


def test_a_run_that_predicts_test_needs_the_test_file_too(tmp_path, monkeypatch):
    rte = rte_copy(tmp_path, ("train", "dev"))
    monkeypatch.setenv("GLUE_DIR", str(tmp_path))
    assert load_task_data(RunConfig(task="RTE", max_train_examples=5)).train.source == str(
        rte / "train.tsv")
    with pytest.raises(DataError) as info:
        load_task_data(RunConfig(task="RTE", predict_test=True))
    assert str(info.value).startswith(f"GLUE_DIR={tmp_path}: {rte / 'test.tsv'} (absent); a run "
                                      "of RTE reads train.tsv, dev.tsv, test.tsv there")
    assert data.glue_source("", "QNLI") == "hub"      # the project's QNLI lacks train.tsv


def test_glue_source(monkeypatch, tmp_path):
    monkeypatch.delenv("GLUE_DIR", raising=False)
    assert data.glue_source("") == "hub" and data.glue_source("hub") == "hub"
    assert data.glue_source(str(tmp_path)) == Path(tmp_path)
    monkeypatch.setenv("GLUE_DIR", str(tmp_path))
    assert data.glue_source("") == Path(tmp_path)
    assert data.glue_source("hub") == "hub"


# --------------------------------------------------------------------------- token cache

def assert_same_examples(got: Examples, want: Examples):
    for name in ("input_ids", "token_type_ids", "special"):
        a, b = getattr(got, name), getattr(want, name)
        assert (a is None) == (b is None) and len(a or []) == len(b or [])
        for x, y in zip(a or [], b or []):
            assert x.dtype == y.dtype
            np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(got.labels, want.labels)
    assert got.labels.dtype == want.labels.dtype


@pytest.mark.parametrize("pair", [False, True])
def test_cached_encode_is_the_plain_one_and_the_second_run_reads_the_cache(tok, tmp_path,
                                                                           monkeypatch, pair):
    split = make_split(SINGLE, PAIR_B if pair else None, labels=[1, 0, 1])
    plain = encode(tok, split, 12, regression=False)
    first = encode(tok, split, 12, regression=False, cache_dir=tmp_path)
    assert len(list(tmp_path.glob("*.safetensors"))) == 1 and not list(tmp_path.glob("*.tmp*"))
    monkeypatch.setattr(token_cache, "tokenize", lambda *a: pytest.fail("tokenized again"))
    second = encode(tok, split, 12, regression=False, cache_dir=tmp_path)
    for got in (first, second):
        assert_same_examples(got, plain)


def test_cached_synthetic_split_keeps_its_token_importance(tok, tmp_path):
    split = synthetic.generate(True, 12, "train")
    plain = encode(tok, split, 128, regression=False)
    encode(tok, split, 128, regression=False, cache_dir=tmp_path)
    cached = encode(tok, split, 128, regression=False, cache_dir=tmp_path)
    assert_same_examples(cached, plain)
    for x, y in zip(cached.importance, plain.importance):
        np.testing.assert_array_equal(x, y)


def test_token_cache_key_follows_tokenizer_length_and_texts(tmp_path):
    tok = load_tokenizer("minilm")            # a fresh copy: add_tokens changes it
    split = make_split(SINGLE, PAIR_B)
    key = token_cache.token_cache_key(tok, split, 128)
    assert key == token_cache.token_cache_key(tok, make_split(SINGLE, PAIR_B, labels=[0, 0, 1]),
                                              128)
    others = {token_cache.token_cache_key(tok, split, 64),
              token_cache.token_cache_key(tok, make_split(SINGLE, PAIR_B[:2] + ["other"]), 128),
              token_cache.token_cache_key(tok, make_split(SINGLE), 128),
              token_cache.token_cache_key(tok, make_split(PAIR_B, SINGLE), 128)}  # a and b swapped
    tok.add_tokens(["xyzzyword"])
    others.add(token_cache.token_cache_key(tok, split, 128))
    assert len(others) == 5 and key not in others


def test_an_unreadable_cache_entry_is_rewritten(tok, tmp_path):
    split = make_split(SINGLE, labels=[1, 0, 1])
    path = tmp_path / f"{token_cache.token_cache_key(tok, split, 128)}.safetensors"
    path.write_bytes(b"half a file")
    got = encode(tok, split, 128, regression=False, cache_dir=tmp_path)
    assert_same_examples(got, encode(tok, split, 128, regression=False))
    assert_same_examples(Examples(*token_cache.load_tokens(path)[:3], labels=got.labels), got)



# rows of "good" (one word-piece): n words are n + 2 tokens alone, n + m + 3 as a pair
rows_of_words = st.lists(st.tuples(st.integers(0, 12), st.integers(0, 12)), min_size=1, max_size=6)


@settings(max_examples=40, deadline=None)
@given(rows_of_words, st.booleans(), st.integers(5, 16))
def test_tokenize_counts_each_rows_full_length_and_truncates_as_before(tok, rows, pair, max_length):
    """Each row's length before max_length cut it, exactly; the ids are the tokenizer's own
    truncated ones (longest-first for pairs), although only the long rows are truncated."""
    a, b = [" ".join(["good"] * n) for n, _ in rows], [" ".join(["good"] * m) for _, m in rows]
    split = make_split(a, b if pair else None)
    got = token_cache.tokenize(tok, split, max_length)
    full = [n + m + 3 if pair else n + 2 for n, m in rows]
    assert got.full_lengths.tolist() == full
    want = tok(a, b if pair else None, truncation=True, max_length=max_length)["input_ids"]
    assert [x.tolist() for x in got.ids] == want
    assert token_cache.Truncation.of(got.full_lengths, max_length) == token_cache.Truncation(
        len(rows), sum(n > max_length for n in full), max(full))


def test_a_cached_split_keeps_its_truncation_count(tok, tmp_path, monkeypatch):
    split = make_split(SINGLE, PAIR_B, labels=[1, 0, 1])     # 9, 13 and 14 tokens
    want = token_cache.Truncation(rows=3, truncated=2, longest=14)
    first = data.encode_counted(tok, split, 10, regression=False, cache_dir=tmp_path)
    monkeypatch.setattr(token_cache, "tokenize", lambda *a: pytest.fail("tokenized again"))
    second = data.encode_counted(tok, split, 10, regression=False, cache_dir=tmp_path)
    assert first[1] == second[1] == want
    assert_same_examples(second[0], first[0])
    assert [len(x) for x in first[0].input_ids] == [9, 10, 10]


def test_truncation_line_names_each_cut_split_and_the_longest_row():
    cut = token_cache.Truncation
    assert token_cache.truncation_line({"train": cut(10, 0, 90), "dev": cut(5, 0, 12)}, 128) is None
    assert token_cache.truncation_line({}, 128) is None
    assert (token_cache.truncation_line({"train": cut(2834, 312, 311), "dev": cut(709, 0, 120)},
                                        128)
            == "train: 312 of 2834 rows (11.0%) truncated to max_length 128 (longest 311 tokens)")
    assert (token_cache.truncation_line({"train": cut(3, 1, 40), "dev": cut(6, 4, 52)}, 16)
            == "train: 1 of 3 rows (33.3%), dev: 4 of 6 rows (66.7%) truncated to max_length 16 "
               "(longest 52 tokens)")

def test_the_second_run_of_a_grid_reads_its_splits_from_the_token_cache(tmp_path, monkeypatch):
    from kit.train.finetune import fit
    base = {"task": "synthetic", "model": "tiny", "synthetic_size": 64, "epochs": 1,
            "save_checkpoints": False, "outputs_dir": str(tmp_path)}
    first = fit(RunConfig(**base, seed=0))
    assert len(list(token_cache.token_cache_dir(tmp_path).glob("*.safetensors"))) == 2       # train, dev
    monkeypatch.setattr(token_cache, "tokenize", lambda *a: pytest.fail("tokenized again"))
    second = fit(RunConfig(**base, seed=1))
    assert first["status"] == second["status"] == "ok"
