"""Dropout whose random numbers cost less on a CPU: the keep mask drawn as 16-bit lanes of 64-bit
random words (one generator draw per 4 elements) instead of torch's Bernoulli draw per element.

Why: on a CPU, `torch.nn.functional.dropout` draws each element's Bernoulli sample from the
generator one at a time; where the matmuls are fast (bf16 on AMX / avx512_bf16) that draw is
~22% of a training step (bench/step_profile.py). Here a lane is dropped when its 16 random bits
fall under round(p * 65536), so the drop rate is that over 65536 (p = 0.1: 0.100006; the output
is scaled by 1 / (1 - that rate), so it stays unbiased), lanes independent. Given the same mask
the output is torch's bit for bit (x * mask * scale, the scale applied in fp32). The words come
from the default generator, so a checkpoint's RNG state restores the stream (exact resume).

`use_packed_dropout(model)` swaps every `nn.Dropout` for `PackedDropout` and the SDPA attention
of Hugging Face models for `ATTENTION`: SDPA's own math path on a CPU (the one torch takes when
dropout is on: fp32 softmax for bf16 inputs, causal and grouped heads as transformers asks) with
the packed mask on the attention probabilities; without dropout (evaluation) it is SDPA itself.
Eager attention (attention guiding) keeps torch's dropout on the probabilities.
Measured in docs/benchmarks.md ("Dropout's random numbers").
"""
from __future__ import annotations

import math

import torch
from torch import nn
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

from kit.models.attention_mask import PACKED_SDPA
from kit.models.transformers_adapter import attn_implementation

LANES = 65536           # values of a 16-bit lane
# the softmax of torch's math path: since 2.5 a "safe" one (a row with nothing to attend gives
# 0s, not NaN); before, the plain one
SOFTMAX = getattr(torch, "_safe_softmax", torch.softmax)
ATTENTION = PACKED_SDPA     # the attention implementation's name: kit.models.attention_mask's


def keep_mask(shape: torch.Size | tuple, drop_lanes: int, device=None) -> torch.Tensor:
    """A bool mask of `shape`, each element False with probability drop_lanes / 65536: the 16-bit
    lanes of full-range random int64 words (4 lanes a word), read as int16."""
    n = 1
    for size in shape:
        n *= size
    words = torch.empty((n + 3) // 4, dtype=torch.int64, device=device).random_(-2 ** 63, None)
    return words.view(torch.int16)[:n].view(shape) >= drop_lanes - LANES // 2


def drop(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """`torch.nn.functional.dropout(x, p, training)` with the packed mask (rate round(p * 65536)
    / 65536)."""
    if not training or p == 0:
        return x
    if p >= 1:
        return x * 0
    drop = round(p * LANES)
    return x.mul(keep_mask(x.shape, drop, x.device)).mul_(LANES / (LANES - drop))


class PackedDropout(nn.Dropout):
    """nn.Dropout (same `p`, same place in the model) drawing its mask with `drop` above."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return drop(x, self.p, self.training)


def packed_sdpa(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                is_causal=None, **kwargs):
    """transformers' attention-function contract: SDPA, except with dropout on, where SDPA on a
    CPU runs its math path - here that path (`_math_path`) with the packed mask instead of
    torch's dropout. Causal attention and grouped key/value heads as transformers' SDPA function
    decides them; what else it handles (softcap, position_bias) is refused in one line rather
    than dropped. Returns (output as batch x length x heads x dim, None)."""
    if not dropout:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=0.0,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
    unsupported = [k for k in ("softcap", "position_bias") if kwargs.get(k) is not None]
    if unsupported:
        raise ValueError(f"packed dropout's attention does not take {', '.join(unsupported)}: "
                         "set dropout_rng: torch for this model")
    # transformers' rules (sdpa_attention_forward): the module's flag unless the call gives one,
    # causal only where no mask is given; grouped key/value heads repeated to the query's
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    causal = bool(causal and attention_mask is None and query.shape[2] > 1)
    groups = getattr(module, "num_key_value_groups", 1)
    out = _math_path(query, key, value, attention_mask, scaling, causal, groups,
                     lambda probs: drop(probs, dropout))
    return out.transpose(1, 2).contiguous(), None


def _math_path(query, key, value, mask, scale, causal: bool, groups: int, dropout):
    """torch's SDPA math path (aten::_scaled_dot_product_attention_math), step for step, so that
    without dropout it is SDPA's MATH backend bit for bit (tests/test_packed_dropout.py): under
    autocast the inputs in its dtype; half-precision inputs computed in fp32 (the softmax above
    all) and the output cast back; the scale split between query and key; a boolean mask or the
    causal one as an additive -inf; a row with nothing to attend gives 0 (safe softmax), not NaN.
    `dropout` takes the probabilities to the dropped ones."""
    device = query.device.type
    if torch.is_autocast_enabled(device):       # SDPA is a lower-precision op under autocast
        low = torch.get_autocast_dtype(device)
        query, key, value = (t.to(low) for t in (query, key, value))
        if mask is not None and mask.is_floating_point():
            mask = mask.to(low)
    origin = query.dtype
    if mask is not None and mask.dtype == torch.bool:
        mask = _additive(mask, origin)
    with torch.autocast(device, enabled=False):
        q, k, v = (t.float() if t.dtype in (torch.float16, torch.bfloat16) else t
                   for t in (query, key, value))
        factor = math.sqrt(scale if scale is not None else 1 / math.sqrt(q.shape[-1]))
        if causal:
            length, keys = q.shape[-2], k.shape[-2]
            mask = _additive(torch.ones(length, keys, dtype=torch.bool, device=q.device).tril(),
                             q.dtype)
        if groups > 1:
            k, v = k.repeat_interleave(groups, -3), v.repeat_interleave(groups, -3)
        scores = (q * factor) @ (k.transpose(-2, -1) * factor)
        if mask is not None:
            scores = scores + mask
        probs = dropout(SOFTMAX(scores, -1))
        return (probs @ v).to(origin)


def _additive(mask: torch.Tensor, dtype) -> torch.Tensor:
    """A boolean mask (True = attend) as SDPA adds it: 0 there, -inf elsewhere."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(
        ~mask, float("-inf"))


AttentionInterface.register(ATTENTION, packed_sdpa)
ALL_MASK_ATTENTION_FUNCTIONS.register(ATTENTION, sdpa_mask)


def use_packed_dropout(model: nn.Module) -> int:
    """Swap, in place, every nn.Dropout of `model` for PackedDropout and the SDPA attention of
    its Hugging Face models for `packed_sdpa`. Returns how many dropout modules were swapped."""
    swapped = 0
    for module in list(model.modules()):
        for name, child in module.named_children():
            if type(child) is nn.Dropout:
                setattr(module, name, PackedDropout(child.p).train(child.training))
                swapped += 1
    for module in model.modules():
        if isinstance(module, PreTrainedModel) and attn_implementation(module.config) == "sdpa":
            module.set_attn_implementation(ATTENTION)
    return swapped
