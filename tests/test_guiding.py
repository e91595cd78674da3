"""Attention-guiding losses on hand-made maps with known values, and on a tiny BERT."""
import math

import pytest
import torch
from transformers import BertConfig, BertModel

from kit.methods.guiding import guiding_loss, head_vectors

TAU = 2.0


def layers_of(maps: torch.Tensor, heads_per_layer: int):
    """Split [B, H_total, T, T] into the per-layer tuple an HF encoder returns."""
    return tuple(maps.split(heads_per_layer, dim=1))


def parts(maps, mask, reduction="query", heads_per_layer=2):
    _, p = guiding_loss(layers_of(maps, heads_per_layer), mask, "task+both", reduction=reduction)
    return p["pd"].item(), p["md"].item()


def identical_heads_values(h: int, t: int) -> tuple[float, float]:
    """All heads share the unit vector v = 1/sqrt(T): C = A^T A = H v v^T = H/T everywhere, so
    each row of (C - I)^2 sums to (T - 1)(H/T)^2 + (H/T - 1)^2; all MD logits are equal, so
    the cross-entropy is log H."""
    return (t - 1) * (h / t) ** 2 + (h / t - 1) ** 2, math.log(h)


def test_identical_uniform_heads_have_known_losses():
    b, h, t = 2, 6, 4
    maps = torch.full((b, h, t, t), 1.0 / t)
    pd, md = parts(maps, torch.ones(b, t))
    want_pd, want_md = identical_heads_values(h, t)
    assert pd == pytest.approx(want_pd, rel=1e-6)
    assert md == pytest.approx(want_md, rel=1e-6)


def test_orthogonal_one_hot_heads_reach_the_minimum():
    # Head h sends every query to key h: the received vectors are the rows of I, so C = I
    # (PD = 0, its minimum) and the MD logits are I / tau: CE = log(1 + (H - 1) e^(-1/tau)),
    # the least possible since off-diagonal similarities of non-negative vectors are >= 0.
    t = h = 4
    maps = torch.eye(h)[:, None, :].expand(h, t, t)[None]            # [1, H, T(query), T(key)]
    pd, md = parts(maps, torch.ones(1, t))
    assert pd == pytest.approx(0.0, abs=1e-6)
    assert md == pytest.approx(math.log(1 + (h - 1) * math.exp(-1 / TAU)), rel=1e-6)


def random_maps(b, h, t, real, seed=0):
    """Softmax maps of shape [B, H, T, T] whose padded keys (>= real[i]) get zero probability
    (as HF's additive mask does) and whose padded query rows are junk."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(b, h, t, t, generator=g) * 3
    key_is_pad = torch.arange(t)[None, :] >= torch.tensor(real)[:, None]   # [B, T]
    maps = logits.masked_fill(key_is_pad[:, None, None, :], -1e9).softmax(-1)
    junk = torch.rand(b, h, t, t, generator=g)
    return torch.where(key_is_pad[:, None, :, None], junk, maps), (~key_is_pad).long()


def test_padding_is_ignored():
    maps, mask = random_maps(1, 4, 7, real=[4])
    for reduction in ("query", "key"):
        padded = parts(maps, mask, reduction)
        trimmed = parts(maps[..., :4, :4], mask[:, :4], reduction)
        assert padded == pytest.approx(trimmed, rel=1e-5)


def test_batch_loss_is_mean_of_examples_of_different_lengths():
    maps, mask = random_maps(2, 4, 6, real=[6, 3])
    batch = parts(maps, mask)
    alone = [parts(maps[i:i + 1, ..., :n, :n], mask[i:i + 1, :n]) for i, n in enumerate([6, 3])]
    assert batch == pytest.approx([sum(x) / 2 for x in zip(*alone)], rel=1e-5)


def test_key_reduction_is_constant_on_any_softmax_maps():
    # The released code's defect: every row sums to one, so each head vector is 1/T.
    maps, mask = random_maps(3, 6, 5, real=[5, 5, 5])
    assert torch.allclose(head_vectors(layers_of(maps, 2), mask, "key"), torch.full((3, 6, 5), 0.2))
    assert parts(maps, mask, "key") == pytest.approx(identical_heads_values(6, 5), rel=1e-5)


def test_total_is_weighted_sum_and_differentiable():
    maps, mask = random_maps(2, 4, 5, real=[5, 3])
    maps.requires_grad_(True)
    total, p = guiding_loss(layers_of(maps, 2), mask, "task+both", pd_factor=0.3, ad_factor=0.7)
    assert total.item() == pytest.approx(0.3 * p["pd"].item() + 0.7 * p["md"].item(), rel=1e-6)
    total.backward()
    assert torch.isfinite(maps.grad).all() and maps.grad.abs().sum() > 0
    pd_only, p = guiding_loss(layers_of(maps, 2), mask, "task+pd")
    assert set(p) == {"pd"} and pd_only.item() == pytest.approx(0.001 * p["pd"].item())
    assert set(guiding_loss(layers_of(maps, 2), mask, "task+ad")[1]) == {"md"}


def test_task_only_and_bad_arguments():
    mask = torch.ones(2, 3)
    total, p = guiding_loss(None, mask, "task")
    assert total.item() == 0.0 and p == {}
    maps = layers_of(torch.full((2, 2, 3, 3), 1 / 3), 1)
    with pytest.raises(ValueError, match="loss_type"):
        guiding_loss(maps, mask, "task+pdg")
    for loss_type in ("task", "task+pd"):
        with pytest.raises(ValueError, match="reduction"):
            guiding_loss(maps, mask, loss_type, reduction="mean")
    for missing in (None, ()):             # () is what an SDPA model returns
        with pytest.raises(ValueError, match="eager"):
            guiding_loss(missing, mask, "task+both")


def tiny_bert(seed: int) -> BertModel:
    torch.manual_seed(seed)
    # A wide initializer gives peaked, input-dependent attention (0.02 gives near-uniform maps).
    cfg = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=64, initializer_range=0.5, attn_implementation="eager")
    return BertModel(cfg).eval()


def test_query_reduction_moves_while_key_reduction_is_stuck():
    ids = torch.randint(1, 100, (2, 9), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    losses = {}
    for seed in (0, 1):                      # two parameter states, same input
        model = tiny_bert(seed)
        attn = model(ids, attention_mask=mask, output_attentions=True).attentions
        for reduction in ("query", "key"):
            total, _ = guiding_loss(attn, mask, "task+both", 1.0, 1.0, reduction=reduction)
            grad = torch.autograd.grad(total, list(model.parameters()), retain_graph=True,
                                       allow_unused=True)
            grad_norm = sum(g.norm() ** 2 for g in grad if g is not None) ** 0.5
            losses[seed, reduction] = total.item(), grad_norm.item()
    moved = {r: abs(losses[0, r][0] - losses[1, r][0]) for r in ("query", "key")}
    assert moved["query"] > 1e-2
    assert moved["query"] > 1e4 * max(moved["key"], 1e-9)
    # ... and the key-axis loss sends (almost) no gradient into the model.
    assert losses[0, "query"][1] > 1e4 * max(losses[0, "key"][1], 1e-9)
