"""SSA masking and labelling: property tests over random rows, and both label rules on
hand-made predictions (a fake model whose prediction flips exactly when a chosen token is masked);
saved labels are data: replayed exactly, a pickle in their place refused unread."""
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest
import torch

from test_io import RunsCode      # the crafted pickle, defined once
from kit import runs
from kit.runs import arrays
from kit.config.run_config import RunConfig
from kit.data.pipeline import IGNORE, Examples
from kit.methods.bert_mask import (Masking, draw_masks, masked_copies, ratio_masks, real_tokens,
                                   span_masks, variant_counts)
from kit.methods.ssa import SSASettings, code_share
from kit.methods.epochs import build_epoch

MASK, CLS, SEP, CUE = 103, 101, 102, 7


def settings(**knobs) -> SSASettings:
    """A run's SSA settings as kit.train.finetune builds them: RunConfig's defaults plus `knobs`."""
    return SSASettings.from_config(RunConfig(**knobs))


def make_examples(n: int, rng: np.random.Generator, pair: bool = False, cue_every: int = 0) -> Examples:
    """Rows like [CLS] a.. [SEP] (b.. [SEP]) with random lengths; optionally a CUE token."""
    ids, special = [], []
    for i in range(n):
        a = list(rng.integers(1000, 2000, size=rng.integers(3, 12)))
        if cue_every and i % cue_every == 0:
            a[rng.integers(len(a))] = CUE
        row = [CLS, *a, SEP]
        if pair:
            row += [*rng.integers(1000, 2000, size=rng.integers(2, 8)), SEP]
        ids.append(np.array(row))
        special.append(np.isin(np.array(row), [CLS, SEP]))
    return Examples(ids, None, special, np.zeros(n, dtype=np.int64))


@pytest.mark.parametrize("ratio", [0.15, 0.3, 0.5, 1.0])
@pytest.mark.parametrize("pair", [False, True])
def test_ratio_masks_count_and_never_special(ratio, pair):
    rng = np.random.default_rng(0)
    ex = make_examples(200, rng, pair=pair)
    real = real_tokens(ex)
    masks = ratio_masks(real, ratio, rng)
    n_real = real.sum(1)
    assert (masks.sum(1) == np.maximum(1, np.floor(ratio * n_real + 0.5))).all()
    assert not (masks & ~real).any()          # never [CLS]/[SEP]/padding


def test_ratio_masks_reach_both_segments_of_pairs():
    rng = np.random.default_rng(1)
    ex = make_examples(300, rng, pair=True)
    masks = ratio_masks(real_tokens(ex), 0.3, rng)
    second = np.zeros_like(masks)
    for i, s in enumerate(ex.special):
        first_sep = np.flatnonzero(s)[1]
        second[i, first_sep + 1: len(s)] = True
    assert (masks & second).any(axis=1).mean() > 0.5


def test_span_masks_only_real_tokens_and_code_like_share():
    rng = np.random.default_rng(2)
    ex = make_examples(2000, rng, pair=True)
    real = real_tokens(ex)
    masks = span_masks(real, aug_threshold=0.1, rm_threshold=0.7, rng=rng)
    assert not (masks & ~real).any()
    share = masks.sum() / real.sum()
    assert 0.10 < share < 0.20                # the released code masks about 12-16%


@pytest.mark.parametrize("scheme", ["ratio", "spans"])
def test_masks_are_deterministic_per_seed(scheme):
    ex = make_examples(50, np.random.default_rng(3))
    masking = Masking(scheme, ratio=0.3, aug_threshold=0.1, rm_threshold=0.7)
    a = draw_masks(real_tokens(ex), masking, np.random.default_rng(9))
    b = draw_masks(real_tokens(ex), masking, np.random.default_rng(9))
    c = draw_masks(real_tokens(ex), masking, np.random.default_rng(10))
    assert (a == b).all() and not (a == c).all()


def test_masked_copies_use_the_given_mask_id_only():
    ex = make_examples(20, np.random.default_rng(4))
    masks = ratio_masks(real_tokens(ex), 0.3, np.random.default_rng(0))
    copies = masked_copies(ex, masks, mask_id=50264)     # RoBERTa's <mask> id
    for row, orig, m in zip(copies.input_ids, ex.input_ids, masks):
        m = m[: len(orig)]
        assert (row[m] == 50264).all() and (row[~m] == orig[~m]).all()


@pytest.mark.parametrize("gamma,expected", [(0.0, 0.0), (1.0, 1.0), (2.0, 2.0), (0.6, 0.6), (1.5, 1.5)])
def test_gamma_accounting(gamma, expected):
    counts = variant_counts(20000, gamma, np.random.default_rng(0))
    assert counts.min() >= np.floor(gamma) and counts.max() <= np.ceil(gamma)
    assert abs(counts.mean() - expected) < 0.02


def cue_model(examples: Examples) -> np.ndarray:
    """Predicts 1 iff the CUE token is present: masking the cue flips the prediction."""
    return np.array([int((ids == CUE).any()) for ids in examples.input_ids])


def labelled(ex: Examples):
    return [(ids, lab) for ids, lab in zip(ex.input_ids, ex.ssa_labels) if (lab != IGNORE).any()]


@pytest.mark.parametrize("merge", ["union", "variant"])
def test_paper_rule_labels_flip_tokens_one_and_others_zero(merge):
    rng = np.random.default_rng(5)
    train = make_examples(300, rng, cue_every=2)
    train.labels = cue_model(train)
    train.labels[::7] = 1 - train.labels[::7]          # some sentences are predicted wrongly
    ssa = settings(method="ssa-co", gamma=1.0, label_merge=merge)
    epoch_set, stats = build_epoch(train, ssa, 1, cue_model, regression=False, mask_id=MASK)
    wrong = np.flatnonzero(cue_model(train) != train.labels)
    assert stats["probed"] == 300 and stats["kept"] == 300 - len(wrong)
    assert stats["variants"] == stats["kept"]            # gamma 1: one variant each
    assert len(epoch_set) == (300 if merge == "union" else 300 + stats["variants"])
    ones = zeros = 0
    for ids, lab in labelled(epoch_set):
        assert (lab[np.isin(ids, [CLS, SEP])] == IGNORE).all()
        cue_at = ids == CUE
        if (lab[cue_at] != IGNORE).any():                # the cue was masked: prediction flipped
            assert (lab[lab != IGNORE] == 1).all()
            ones += 1
        else:                                            # masking distractors changes nothing
            assert (lab[lab != IGNORE] == 0).all()
            zeros += 1
    assert ones > 10 and zeros > 50
    if merge == "union":    # wrongly predicted sentences carry no labels
        assert all((epoch_set.ssa_labels[i] == IGNORE).all() for i in wrong)


def test_union_merges_several_variants_per_sentence():
    train = make_examples(100, np.random.default_rng(6), cue_every=1)
    train.labels = cue_model(train)
    ssa = settings(method="ssa-co", gamma=3.0, label_merge="union")
    epoch_set, stats = build_epoch(train, ssa, 1, cue_model, False, MASK)
    assert stats["variants"] == 300 and len(epoch_set) == 100
    for ids, lab in zip(epoch_set.input_ids, epoch_set.ssa_labels):
        assert lab[ids == CUE][0] in (IGNORE, 1)       # the cue is never labelled 0
        assert ((lab != IGNORE).sum() >= min(3, (~np.isin(ids, [CLS, SEP])).sum()) * 0.3)


def test_paper_rule_regression_tolerance():
    train = make_examples(50, np.random.default_rng(7), cue_every=2)
    train.labels = cue_model(train).astype(np.float32) * 2.0
    predict = lambda ex: cue_model(ex).astype(np.float32) * 2.0 + 0.1  # noqa: E731
    ssa = settings(method="ssa-h", regression_tolerance=0.3)
    epoch_set, stats = build_epoch(train, ssa, 1, predict, True, MASK)
    assert stats["kept"] == 50                           # within 0.3 of the target
    assert 0 < stats["flipped"] < stats["variants"]      # moved by 2.0 only when the cue is masked
    tight = settings(method="ssa-h", regression_tolerance=0.05)
    assert build_epoch(train, tight, 1, predict, True, MASK)[1]["kept"] == 0


def test_code_rule_keeps_unchanged_copies_with_code_labels_and_share_schedule():
    rng = np.random.default_rng(8)
    train = make_examples(400, rng, cue_every=2)
    train.labels = cue_model(train)
    ssa = settings(method="ssa-co", label_rule="code", mask_scheme="spans", ssa_start_epoch=1)
    shares = [code_share(e, ssa.ssa_start_epoch, ssa.code_share_step, ssa.code_share_max)
              for e in range(7)]
    assert shares == pytest.approx([0, 0.2, 0.4, 0.6, 0.8, 0.8, 0.8])
    epoch_set, stats = build_epoch(train, ssa, 2, cue_model, False, MASK)
    assert len(epoch_set) == 400                         # copies replace plain examples
    copies = [i for i, ids in enumerate(epoch_set.input_ids) if (ids == MASK).any()]
    assert len(copies) == round(0.4 * 400)
    for i in copies:
        ids, lab = epoch_set.input_ids[i], epoch_set.ssa_labels[i]
        assert (lab[ids == MASK] == 0).all()                              # masked -> 0
        assert (lab[(ids != MASK) & ~epoch_set.special[i]] == 1).all()    # other real -> 1
        assert (lab[epoch_set.special[i]] == IGNORE).all()
        assert not (ids == CUE).any() or cue_model(epoch_set.subset([i]))[0] == epoch_set.labels[i]
    plain = [i for i in range(400) if i not in copies]
    assert all((epoch_set.ssa_labels[i][~epoch_set.special[i]] == 1).all() for i in plain)
    first, _ = build_epoch(train, ssa, 0, cue_model, False, MASK)   # before SSA starts: all-ones
    assert all((lab[~s] == 1).all() for lab, s in zip(first.ssa_labels, first.special))


def test_labels_are_reproducible_per_seed_and_epoch():
    train = make_examples(120, np.random.default_rng(9), cue_every=3)
    train.labels = cue_model(train)
    ssa = settings(method="ssa-h", seed=3)
    a, _ = build_epoch(train, ssa, 1, cue_model, False, MASK)
    b, _ = build_epoch(train, ssa, 1, cue_model, False, MASK)
    c, _ = build_epoch(train, ssa, 2, cue_model, False, MASK)
    same = lambda x, y: all((p == q).all() for p, q in zip(x.ssa_labels, y.ssa_labels))  # noqa: E731
    assert same(a, b) and not same(a, c)


def test_bert_mask_adds_gamma_copies_with_original_labels():
    train = make_examples(100, np.random.default_rng(10))
    train.labels = np.arange(100) % 2
    ssa = settings(method="bert-mask", gamma=2.0)
    assert build_epoch(train, ssa, 0, cue_model, False, MASK)[0] is train   # before the start epoch
    epoch_set, stats = build_epoch(train, ssa, 1, cue_model, False, MASK)
    assert len(epoch_set) == 300 and stats["augmented"] == 200
    copies = epoch_set.subset(range(100, 300))
    assert all((ids == MASK).any() for ids in copies.input_ids)
    assert (copies.labels == np.repeat(train.labels, 2)).all()


def test_saved_labels_replay(tmp_path):
    train = make_examples(60, np.random.default_rng(11), cue_every=2)
    train.labels = cue_model(train)
    ssa = settings(method="ssa-co", save_labels=True)
    first, stats = build_epoch(train, ssa, 1, cue_model, False, MASK, run_dir=tmp_path)
    assert [p.name for p in (tmp_path / "ssa_labels").iterdir()] == ["epoch1.safetensors"]
    replay = settings(method="ssa-co", reuse_labels_from=str(tmp_path))
    again, stats2 = build_epoch(train, replay, 1, never, False, MASK)
    assert stats2["reused"] and stats2["flipped"] == stats["flipped"]
    for field in fields(Examples):          # every field back, with its dtype
        want, got = getattr(first, field.name), getattr(again, field.name)
        if want is None or isinstance(want, np.ndarray):
            assert (want is None and got is None) or (want.dtype == got.dtype
                                                      and (want == got).all()), field.name
        else:
            assert [(w.dtype, w.tolist()) for w in want] == [(g.dtype, g.tolist()) for g in got]
    (saved,) = runs.read_saved_labels(tmp_path)
    assert saved["stats"] == stats and set(saved["epoch_set"]) == set(vars(first))


def never(examples):
    raise AssertionError("probed despite saved labels")


def plant(run_dir: Path, name: str, marker: Path) -> Path:
    """A crafted pickle where SSA labels are expected: torch.save of the old layout's dict."""
    path = runs.saved_labels_dir(run_dir) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"epoch_set": RunsCode(marker), "stats": {}}, path)
    return path


@pytest.mark.parametrize("name", ["epoch1.pt", "epoch1.npz"])
def test_a_pickle_where_labels_are_expected_is_refused_unread(tmp_path, name):
    """In a run folder's ssa_labels/ and in a reuse_labels_from source, as an old .pt file or
    its bytes named .npz: one line naming the file, and the code in it never runs."""
    marker = tmp_path / "ran"
    planted = plant(tmp_path / "run", name, marker)
    with pytest.raises(arrays.UnsafeFileError) as read:
        list(runs.read_saved_labels(tmp_path / "run"))
    train = make_examples(20, np.random.default_rng(12), cue_every=2)
    train.labels = cue_model(train)
    replay = settings(method="ssa-co", reuse_labels_from=str(tmp_path / "run"))
    with pytest.raises(arrays.UnsafeFileError) as reuse:
        build_epoch(train, replay, 1, never, False, MASK)
    for err in (read, reuse):
        message = str(err.value)
        assert "\n" not in message and message.startswith(f"{planted}: refused"), message
        if name.endswith(".pt"):
            assert "regenerate them" in message, message
    assert not marker.exists()
    torch.load(planted, weights_only=False)      # the payload is real: the old reader ran it
    assert marker.exists()
