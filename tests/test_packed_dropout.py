"""kit.models.packed_dropout: the packed mask's rate and independence (and its statistics beside
torch's dropout's), torch's dropout arithmetic given the mask, the stream restored from the
generator state, the registered attention called as transformers calls it (torch's SDPA math
path given the packed mask, bit for bit: bf16, causal, grouped heads; SDPA itself without
dropout), the swap in a Hugging Face model (nothing saved differently) and `auto`'s rule. A run with it resuming bit for bit: tests/test_preemption.py."""
import contextlib
import json
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import AutoModel, BertConfig, BertModel
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from kit.config.run_config import RunConfig
from kit.models import packed_dropout as pd
from kit.runs import run_dir_of
from kit.train.accel import resolve_dropout_rng
from kit.train.finetune import fit


def _drawn(p: float, n: int = 400_000, seed: int = 0) -> torch.Tensor:
    torch.manual_seed(seed)
    return pd.keep_mask((n,), round(p * pd.LANES))


@given(st.sampled_from([0.05, 0.1, 0.2, 0.5, 0.9]), st.integers(0, 2 ** 31))
def test_the_drop_rate_is_round_p_65536_over_65536(p, seed):
    keep = _drawn(p, seed=seed)
    rate = round(p * pd.LANES) / pd.LANES           # 0.1 -> 6554 / 65536 = 0.100006
    assert abs(rate - p) <= 0.5 / pd.LANES
    dropped = 1 - keep.float().mean().item()
    # 5 standard deviations of a binomial share of 400,000
    assert abs(dropped - rate) <= 5 * (rate * (1 - rate) / keep.numel()) ** 0.5


def test_lanes_are_independent_of_their_neighbours_and_of_their_place_in_the_word():
    """Neighbouring lanes (in one 64-bit word and across words) drop together at rate p^2, and
    each of a word's 4 lanes drops at rate p: no lane is biased by the word's sign bit."""
    keep = _drawn(0.1, n=800_000)
    dropped = ~keep
    p = round(0.1 * pd.LANES) / pd.LANES
    sd = lambda q, n: 5 * (q * (1 - q) / n) ** 0.5  # noqa: E731
    for lag in (1, 2, 3, 4, 5):
        both = (dropped[lag:] & dropped[:-lag]).float().mean().item()
        assert abs(both - p * p) <= sd(p * p, len(dropped) - lag), lag
    for lane in range(4):
        share = dropped[lane::4].float().mean().item()
        assert abs(share - p) <= sd(p, len(dropped) // 4), lane


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_given_its_mask_the_output_and_gradient_are_torchs(dtype):
    """x * mask * scale with the scale applied in fp32, as torch's native dropout computes it;
    the gradient is the same mask and scale."""
    x = torch.randn(64, 33).to(dtype).requires_grad_()
    torch.manual_seed(3)
    out = pd.drop(x, 0.1)
    torch.manual_seed(3)
    keep = pd.keep_mask(x.shape, round(0.1 * pd.LANES))
    scale = pd.LANES / (pd.LANES - round(0.1 * pd.LANES))
    assert torch.equal(out, x.detach().mul(keep).mul_(scale))
    assert torch.equal(out == 0, ~keep | (x == 0))
    out.backward(torch.ones_like(out))
    assert torch.equal(x.grad, torch.ones_like(x).mul(keep).mul_(scale))
    assert pd.drop(x, 0.1, training=False) is x and pd.drop(x, 0.0) is x
    assert torch.equal(pd.drop(x, 1.0), torch.zeros_like(x))


def test_the_stream_is_the_generators_state():
    """Restoring the default generator's state (what a checkpoint holds) redraws the same masks."""
    torch.manual_seed(7)
    state = torch.get_rng_state()
    first = [pd.keep_mask((5, 7, 3), 6554) for _ in range(3)]
    torch.set_rng_state(state)
    assert all(torch.equal(a, pd.keep_mask((5, 7, 3), 6554)) for a in first)
    assert not torch.equal(first[0], first[1])


def _tiny_bert() -> BertModel:
    torch.manual_seed(0)
    return BertModel(BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                                num_attention_heads=2, intermediate_size=64))


def test_the_swap_covers_every_dropout_and_saves_a_plain_model(tmp_path):
    model = _tiny_bert()
    ids = torch.randint(5, 100, (4, 12))
    mask = torch.ones_like(ids)
    mask[0, 8:] = 0                                  # padding: SDPA's boolean mask
    with torch.no_grad():
        before = model.eval()(input_ids=ids, attention_mask=mask).last_hidden_state
    assert pd.use_packed_dropout(model) == 1 + 2 * 3   # embeddings + 3 per layer
    assert model.config._attn_implementation == pd.ATTENTION
    with torch.no_grad():                            # evaluation: SDPA itself
        assert torch.equal(before, model(input_ids=ids, attention_mask=mask).last_hidden_state)
    model.train()
    with torch.profiler.profile() as prof:
        model(input_ids=ids, attention_mask=mask).last_hidden_state.sum().backward()
    ops = {e.key: e.count for e in prof.key_averages()}
    assert "aten::bernoulli_" not in ops and ops["aten::random_"] == 1 + 3 * 2
    model.save_pretrained(tmp_path)                  # plain transformers loads it as SDPA
    assert "kit" not in (tmp_path / "config.json").read_text()
    again = AutoModel.from_pretrained(tmp_path).eval()
    assert again.config._attn_implementation == "sdpa"
    with torch.no_grad():
        assert torch.equal(before, again(input_ids=ids, attention_mask=mask).last_hidden_state)


CASES = ["padding", "additive", "nothing to attend", "causal", "grouped heads", "no mask"]


def _attention_inputs(case: str, dtype):
    """q, k, v (batch 2, 4 query heads, 6 tokens, dim 8), the mask transformers would pass and the
    module it calls the attention function with (is_causal, num_key_value_groups)."""
    torch.manual_seed(1)
    heads = 2 if case == "grouped heads" else 4
    q, k, v = (torch.randn(2, h, 6, 8).to(dtype) for h in (4, heads, heads))
    mask = None
    if case in ("padding", "nothing to attend"):
        mask = torch.ones(2, 1, 6, 6, dtype=torch.bool)
        mask[1, ..., 4:] = False                     # padding: sdpa_mask's boolean mask
        if case == "nothing to attend":
            mask[0, ..., 2, :] = False               # a query row with no key: 0, not NaN
    elif case == "additive":
        mask = torch.randn(2, 1, 6, 6)
    module = SimpleNamespace(is_causal=case == "causal", num_key_value_groups=4 // heads)
    return q, k, v, mask, module


def _sdpa(q, k, v, mask, module, scale, math: bool = False):
    """torch's own SDPA as transformers calls it, on its best backend, or on its MATH backend
    (the path it takes on a CPU with dropout on)."""
    with sdpa_kernel([SDPBackend.MATH]) if math else contextlib.nullcontext():
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, scale=scale, is_causal=module.is_causal and mask is None,
            enable_gqa=module.num_key_value_groups > 1)


def _dropped_math(q, k, v, mask, module, scale, keep, rate):
    """torch's math path with a given keep mask: its probabilities in fp32 (the second output of
    aten::_scaled_dot_product_attention_math, on fp32 copies: the path computes half precision
    in fp32 anyway), dropped as torch's dropout does given the mask (x * keep * 1/(1 - rate),
    the scale in fp32), times v, cast to the inputs' dtype."""
    if mask is not None:     # as SDPA adds it: a float mask in the inputs' dtype (autocast's)
        mask = (mask.to(q.dtype).float() if mask.is_floating_point() else
                torch.zeros(mask.shape).masked_fill(~mask, float("-inf")))
    probs = torch.ops.aten._scaled_dot_product_attention_math(
        q.float(), k.float(), v.float(), mask, 0.0, module.is_causal and mask is None,
        scale=scale, enable_gqa=module.num_key_value_groups > 1)[1]
    values = v.float().repeat_interleave(module.num_key_value_groups, -3)
    return (probs.mul(keep).mul_(1 / (1 - rate)) @ values).to(q.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", CASES)
def test_the_kits_attention_is_torchs_sdpa_math_path(case, dtype):
    """Through transformers' attention interface, the function the swap registers: without
    dropout SDPA itself (its best backend, as transformers calls it); with dropout torch's math path given the packed keep mask (the
    generator's state fixed, the mask drawn again), bit for bit, and its dropout-free
    arithmetic SDPA's MATH backend bit for bit - in fp32 and under bf16 autocast (fp32 softmax,
    as SDPA), with causal modules and grouped key/value heads."""
    attention = ALL_ATTENTION_FUNCTIONS[pd.ATTENTION]
    q, k, v, mask, module = _attention_inputs(case, dtype)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16)
    with autocast:
        sdpa = _sdpa(q, k, v, mask, module, 0.3, math=True)
        assert torch.equal(pd._math_path(q, k, v, mask, 0.3, module.is_causal and mask is None,
                                         module.num_key_value_groups, lambda p: p), sdpa)
        out, _ = attention(module, q, k, v, mask, dropout=0.0, scaling=0.3)
        assert torch.equal(out, _sdpa(q, k, v, mask, module, 0.3).transpose(1, 2))
        torch.manual_seed(5)
        out, _ = attention(module, q, k, v, mask, dropout=0.1, scaling=0.3)
    drop = round(0.1 * pd.LANES)
    torch.manual_seed(5)
    keep = pd.keep_mask((2, 4, 6, 6), drop)
    want = _dropped_math(q, k, v, mask, module, 0.3, keep, drop / pd.LANES)
    assert out.dtype == sdpa.dtype and torch.equal(out, want.transpose(1, 2))


@pytest.mark.parametrize("extra", [{"softcap": 30.0}, {"position_bias": torch.zeros(1, 4, 6, 6)}])
def test_what_the_math_path_does_not_do_is_refused_in_one_line(extra):
    q, k, v, mask, module = _attention_inputs("padding", torch.float32)
    with pytest.raises(ValueError, match=rf"^packed dropout's attention does not take "
                                         rf"{next(iter(extra))}: set dropout_rng: torch"):
        pd.packed_sdpa(module, q, k, v, mask, dropout=0.1, **extra)


def test_the_packed_masks_statistics_are_torchs_dropouts():
    """PackedDropout and torch's nn.Dropout on a large tensor: the same drop rate, and neither
    drops neighbouring elements together more often than independence says (p^2), within 5
    standard errors of the difference."""
    n, p = 2_000_000, 0.1
    torch.manual_seed(11)
    packed = pd.PackedDropout(p).train()(torch.ones(n)) == 0
    theirs = torch.nn.Dropout(p).train()(torch.ones(n)) == 0
    rate = lambda d: d.float().mean().item()                                # noqa: E731
    se = lambda q, m: (q * (1 - q) / m) ** 0.5                              # noqa: E731
    assert abs(rate(packed) - rate(theirs)) <= 5 * 2 ** 0.5 * se(p, n)
    for lag in (1, 2, 3, 4):
        both = [rate(d[lag:] & d[:-lag]) for d in (packed, theirs)]
        assert abs(both[0] - both[1]) <= 5 * 2 ** 0.5 * se(p * p, n - lag), lag
        assert abs(both[0] - p * p) <= 5 * se(p * p, n - lag), lag


@pytest.mark.parametrize("requested,device,precision,compiled,resolved", [
    ("auto", "cpu", "bf16", False, "packed"), ("auto", "cpu", "no", False, "torch"),
    ("auto", "cuda", "bf16", False, "torch"), ("torch", "cpu", "bf16", False, "torch"),
    ("packed", "cpu", "no", False, "packed"), ("auto", "cpu", "bf16", True, "torch"),
    ("packed", "cpu", "bf16", True, "packed")])
def test_auto_is_packed_for_bf16_on_a_cpu_unless_compiled(requested, device, precision, compiled,
                                                          resolved):
    assert resolve_dropout_rng(requested, device, precision, compiled) == resolved


def test_a_run_with_packed_dropout_records_it_and_a_new_run_id(tmp_path):
    base = dict(task="synthetic", model="tiny", method="ssa-h", synthetic_size=64, epochs=1,
                lr=5e-3, batch_size=16, outputs_dir=str(tmp_path), mixed_precision="no")
    packed, plain = RunConfig(**base, dropout_rng="packed"), RunConfig(**base)
    assert packed.run_id != plain.run_id          # another random stream, another run
    assert fit(packed)["dropout_rng"] == "packed" and fit(plain)["dropout_rng"] == "torch"
    assert json.loads((run_dir_of(packed) / "metrics.json").read_text())["status"] == "ok"
