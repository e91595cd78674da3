"""kit.models.packed_dropout: the packed mask's rate and independence, torch's dropout arithmetic
given the mask, the stream restored from the generator state, the swap in a Hugging Face model
(SDPA's math path with the packed mask in training, SDPA itself in evaluation, nothing saved
differently) and `auto`'s rule. A run with it resuming bit for bit: tests/test_preemption.py."""
import json

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from transformers import AutoModel, BertConfig, BertModel

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


def test_training_attention_is_sdpas_math_path_given_the_mask():
    """In training, packed_sdpa computes softmax(q k^T * scale + mask) with the packed dropout,
    times v: torch's SDPA given the same dropped probabilities (dropout_p 0 on a masked copy)."""
    torch.manual_seed(1)
    q, k, v = (torch.randn(2, 3, 6, 8) for _ in range(3))
    attend = torch.ones(2, 1, 6, 6, dtype=torch.bool)
    attend[1, ..., 4:] = False
    torch.manual_seed(5)
    out, _ = pd.packed_sdpa(None, q, k, v, attend, dropout=0.1, scaling=8 ** -0.5)
    torch.manual_seed(5)
    scores = (q @ k.transpose(-2, -1) * 8 ** -0.5).masked_fill(~attend, float("-inf"))
    probs = pd.drop(torch.softmax(scores, -1), 0.1)
    assert torch.allclose(out, (probs @ v).transpose(1, 2), atol=1e-6)


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
