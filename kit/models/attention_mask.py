"""The attention mask in the form the encoder's attention takes it, made on the device without
reading the mask back to the host.

Given the usual 2-D padding mask, transformers (5.x, `masking_utils.create_bidirectional_mask`)
asks `padding_mask.all()` on every forward, to drop the mask when a batch has no padding: a
tensor read in a Python `if`, so a GPU step waits there for every kernel queued before it. An
already prepared 4-D mask skips that (`_preprocess_mask_arguments` returns it as it is), so
for the families whose forward does nothing else with the mask the kit passes the 4-D mask that
transformers would have built: SDPA a boolean [batch, 1, query, key] (True = attend), eager
attention an additive float one (0, or the dtype's minimum). Passing None for a batch without
padding is no way round: knowing that it has none is the same read.

The cost: SDPA never drops the mask, so on a GPU a batch without padding no longer reaches the
flash kernel (a mask takes the memory-efficient one); with length-grouped batches few have none.
Other families (DeBERTa builds its mask without a read; ModernBERT adds a sliding window to it)
and other attention implementations get the 2-D mask as before."""
from __future__ import annotations

import torch

from kit.models.transformers_adapter import attn_implementation

# the name kit.models.packed_dropout registers its SDPA under (bf16 CPUs, dropout on): here, not
# imported from there, which would load transformers' model code (and scipy) into every kernel
PACKED_SDPA = "kit_packed_sdpa"

# model_type of the families whose forward turns the 2-D mask into the 4-D one by
# create_bidirectional_mask and reads it nowhere else
FOUR_D_FAMILIES = ("bert", "roberta", "xlm-roberta", "electra", "distilbert")


def takes_4d_mask(backbone) -> bool:
    config = backbone.config
    return (config.model_type in FOUR_D_FAMILIES and not getattr(config, "is_decoder", False)
            and attn_implementation(config) in ("sdpa", PACKED_SDPA, "eager"))


def encoder_mask(backbone, attention_mask: torch.Tensor) -> torch.Tensor:
    """`attention_mask` ([batch, length], 1 on real tokens) as `backbone` should get it."""
    if not takes_4d_mask(backbone):
        return attention_mask
    batch, length = attention_mask.shape
    # as transformers' sdpa_mask expands it: one row per sequence, broadcast over the queries
    keep = attention_mask.bool()[:, None, None, :].expand(batch, 1, length, length)
    if attn_implementation(backbone.config) in ("sdpa", PACKED_SDPA):   # both take sdpa_mask's
        return keep
    # eager adds the mask to the scores. transformers takes the embeddings' dtype: the weights'
    # (fp32) except where CPU autocast runs LayerNorm in bf16 / fp16, where fp32 is the safer sum
    dtype = next(backbone.parameters()).dtype
    return torch.where(keep, torch.zeros((), device=keep.device, dtype=dtype),
                       torch.finfo(dtype).min)
