"""Attention guiding (Wang et al. 2022): auxiliary losses on the attention maps of all heads.

The encoder must return attention probabilities: build it with `attn_implementation="eager"`
and call it with `output_attentions=True` (SDPA / flash attention return no maps). In train mode
the returned maps are taken after attention dropout, exactly as the released code sees them.

Every head of every layer (H_total = layers x heads) is reduced from its [T, T] map to a
T-vector, then
  PD (pattern decorrelation):  L2-normalise each head vector over T, C = A^T A ([T, T]),
                               loss = sum_j (C - I)_ij^2, averaged over i and the batch;
  MD (map discrimination, "attention diversity" in the code): S = A A^T / tau ([H, H]),
                               cross-entropy of each head against its own index (InfoNCE).
Both follow the released code (alignment.py), plus masking: padded query and key positions
take no part (the released code pads to a fixed length and lets padding count).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

LOSS_TYPES = ("task", "task+pd", "task+ad", "task+both")
REDUCTIONS = ("query", "key")


def head_vectors(attentions, attention_mask: torch.Tensor,
                 reduction: str = "query") -> torch.Tensor:
    """Reduce every head's [T, T] map to a T-vector: [batch, layers * heads, T], float32.

    reduction="query" (default): the attention each key token RECEIVES, averaged over real
        queries; it differs between heads, so the losses can shape the maps.
    reduction="key": the released code's mean over the key axis. Softmax rows sum to one, so
        every entry is 1 / T_real (up to attention dropout) whatever the model does; the losses
        are then constant and give no gradient. Kept only to reproduce the released code.
    Padded positions of the output are exactly zero, so they add nothing to norms or products.
    """
    _check_choice("reduction", reduction, REDUCTIONS)
    real = attention_mask.float()                                    # [B, T]
    mask = real.to(attentions[0].dtype)                              # fp16/bf16 under autocast
    # "query": sum over q of mask_q * attn[q, k]; "key": sum over k of mask_k * attn[q, k].
    pattern = "bhqk,bq->bhk" if reduction == "query" else "bhqk,bk->bhq"
    # Reduce layer by layer, then concatenate: never stacks the full [B, L, H, T, T] maps.
    sums = torch.cat([torch.einsum(pattern, a, mask) for a in attentions], dim=1).float()
    return sums / real.sum(-1).clamp(min=1)[:, None, None] * real[:, None, :]


def pattern_decorrelation(vectors: torch.Tensor, attention_mask: torch.Tensor,
                          weight: torch.Tensor | None = None) -> torch.Tensor:
    """PD loss of head vectors [B, H, T]; the C = A^T A form of the released code.

    Note C is token x token: C_ij = sum_h a_hi a_hj over unit-norm head vectors, and the loss
    pulls it towards the identity (summed over j, averaged over real i, then over the batch).
    """
    real = attention_mask.float()                                    # [B, T]
    a = F.normalize(vectors, p=2, dim=-1)
    c = a.transpose(1, 2) @ a                                        # [B, T, T]
    eye = torch.diag_embed(real)                                     # identity on real tokens only
    per_token = ((c - eye) ** 2).sum(-1)                             # [B, T]; padded rows are 0
    return batch_mean((per_token * real).sum(-1) / real.sum(-1).clamp(min=1), weight)


def map_discrimination(vectors: torch.Tensor, tau: float = 2.0,
                       weight: torch.Tensor | None = None) -> torch.Tensor:
    """MD loss of head vectors [B, H, T]: each head must be told apart from the others."""
    a = F.normalize(vectors, p=2, dim=-1)
    logits = a @ a.transpose(1, 2) / tau                             # [B, H, H]
    batch, heads, _ = logits.shape
    target = torch.arange(heads, device=logits.device).repeat(batch)
    if weight is None:
        return F.cross_entropy(logits.reshape(batch * heads, heads), target)
    per_head = F.cross_entropy(logits.reshape(batch * heads, heads), target, reduction="none")
    return batch_mean(per_head.reshape(batch, heads).mean(-1), weight)


def batch_mean(values: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
    """The mean over the batch's rows; with `weight` (a static shape's batch: 0 on its padding
    rows) the mean over the weighted rows."""
    return values.mean() if weight is None else (values * weight).sum() / weight.sum()


def guiding_loss(attentions, attention_mask: torch.Tensor, loss_type: str,
                 pd_factor: float = 0.001, ad_factor: float = 0.001,
                 reduction: str = "query", tau: float = 2.0,
                 weight: torch.Tensor | None = None):
    """Weighted auxiliary loss to add to the task loss, and its unweighted parts for logging.

    attentions: per-layer tensors [B, heads, T, T] (HF `outputs.attentions`); may be None for
    loss_type="task". Returns (pd_factor * PD + ad_factor * MD, {"pd": ..., "md": ...}) where the
    dict holds the detached unweighted losses that loss_type asks for (empty for "task").
    `weight`: 1 a row, 0 a padding row of a static shape (kit.data.pipeline.StaticShape).
    """
    _check_choice("loss_type", loss_type, LOSS_TYPES)
    _check_choice("reduction", reduction, REDUCTIONS)
    if loss_type == "task":
        return torch.zeros((), device=attention_mask.device), {}
    if not attentions:
        raise ValueError(f"loss_type {loss_type!r} needs attention maps: run the encoder with "
                         "attn_implementation='eager' and output_attentions=True")
    vectors = head_vectors(attentions, attention_mask, reduction)
    total = torch.zeros((), device=vectors.device)
    parts = {}
    if loss_type in ("task+pd", "task+both"):
        pd = pattern_decorrelation(vectors, attention_mask, weight)
        total = total + pd_factor * pd
        parts["pd"] = pd.detach()
    if loss_type in ("task+ad", "task+both"):
        md = map_discrimination(vectors, tau, weight)
        total = total + ad_factor * md
        parts["md"] = md.detach()
    return total, parts


def _check_choice(what: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"unknown {what} {value!r}: choose one of {', '.join(allowed)}")
