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
dropout is on) with the packed mask on the attention probabilities; without dropout (evaluation)
it is SDPA itself. Eager attention (attention guiding) keeps torch's dropout on the probabilities.
Measured in docs/benchmarks.md ("Dropout's random numbers").
"""
from __future__ import annotations

import torch
from torch import nn
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

LANES = 65536           # values of a 16-bit lane
ATTENTION = "kit_packed_sdpa"


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
                **kwargs):
    """transformers' attention-function contract: SDPA, except with dropout on, where SDPA on a
    CPU runs its math path (scores, softmax, dropout, product) - here the same with the packed
    mask. Returns (output as batch x length x heads x dim, None)."""
    if not dropout:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=0.0,
                                      scaling=scaling, **kwargs)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    scores = torch.matmul(query, key.transpose(-2, -1)) * scale
    if attention_mask is not None:        # sdpa_mask's: True = attend (bool), or additive
        scores = (scores.masked_fill(~attention_mask, float("-inf"))
                  if attention_mask.dtype == torch.bool else scores + attention_mask)
    probs = drop(torch.softmax(scores, dim=-1), dropout)
    out = torch.matmul(probs.to(value.dtype), value)
    return out.transpose(1, 2).contiguous(), None


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
        if isinstance(module, PreTrainedModel) and module.config._attn_implementation == "sdpa":
            module.set_attn_implementation(ATTENTION)
    return swapped
