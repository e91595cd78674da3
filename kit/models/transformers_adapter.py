"""The one part of transformers the kit reads that transformers offers no public reader for: the
attention implementation a model runs (`config._attn_implementation`; transformers 5 sets it
with the public `set_attn_implementation` but reads it only through that private property).
tests/test_accelerate_adapter.py pins it beside accelerate's private parts, so a transformers
that renamed it fails there, loudly, not as a silently different mask in every run."""
from __future__ import annotations


def attn_implementation(config) -> str | None:
    """"sdpa", "eager", "flash_attention_2", a registered name (kit.models.packed_dropout's
    packed_sdpa) ... as the model with this config runs its attention."""
    return config._attn_implementation
