"""SSA's model parts: SSA-Co's token-importance head and its loss, SSA-H's hybrid sentence vector.

The head predicts, per token, whether it is important (class 1); it trains on the labels
kit.methods.ssa generates (`ssa_loss`, next to the target loss: kit.train.finetune.loss_terms).
SSA-H also feeds the importance-weighted token mix into the sentence head (`hybrid_sentence`).
kit.methods.bert.SequenceModel adds them where the method's registry row asks (`token_head`,
`hybrid`).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class TokenImportanceHead(nn.Module):
    """SSA head: dense + GELU + LayerNorm, then 2 logits per token (unimportant, important).
    `shared=False` is the released code's share_weight=0: one final classifier per position."""

    def __init__(self, hidden: int, max_positions: int, shared: bool = True, eps: float = 1e-12):
        super().__init__()
        self.transform = nn.Sequential(nn.Linear(hidden, hidden), nn.GELU(),
                                       nn.LayerNorm(hidden, eps=eps))
        self.shared = shared
        if shared:
            self.classifier = nn.Linear(hidden, 2)
        else:
            self.weight = nn.Parameter(torch.randn(max_positions, hidden, 2) * 0.02)
            self.bias = nn.Parameter(torch.zeros(max_positions, 2))

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        h = self.transform(hidden_states)
        if self.shared:
            return self.classifier(h)
        t = h.shape[1]
        return torch.einsum("bth,thc->btc", h, self.weight[:t]) + self.bias[:t]


def masked_softmax(scores: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Softmax over the last axis among `keep` positions; rows with nothing kept get all zeros
    (not NaN), so the weighted token sum is simply zero there."""
    scores = scores.masked_fill(~keep, float("-inf"))
    any_kept = keep.any(dim=-1, keepdim=True)
    weights = torch.softmax(scores.masked_fill(~any_kept, 0.0), dim=-1)
    return weights * keep


HYBRID_WEIGHTINGS = ("paper", "code", "logodds")


def hybrid_weights(token_logits: torch.Tensor, real: torch.Tensor, weighting: str,
                   threshold: float) -> torch.Tensor:
    """Token weights w_i of the SSA-H layer over real (non-special, non-padding) tokens, from
    the token head's logits [.., T, 2] (class 1 = important); p_i = P(important) = softmax_i[1].
    paper:   w = softmax over real tokens of p_i (Eq. 1 with y_i = p_i; no threshold).
    code:    the released code: tokens with p_i < threshold dropped, softmax over the others' p_i.
    logodds: softmax over real tokens of log(p_i / (1 - p_i)) = logit_1 - logit_0, i.e. w_i
             proportional to p_i / (1 - p_i): much sharper than `paper`
             (the kit's default before RESULTS_VERSION 3).
    `threshold` only matters for `code`."""
    if weighting == "logodds":
        return masked_softmax(token_logits[..., 1] - token_logits[..., 0], real)
    p = torch.softmax(token_logits, dim=-1)[..., 1]
    if weighting == "paper":
        return masked_softmax(p, real)
    if weighting == "code":
        return masked_softmax(p, real & (p >= threshold))
    raise ValueError(f"unknown hybrid weighting {weighting!r}: choose one of "
                     f"{', '.join(HYBRID_WEIGHTINGS)}")


def hybrid_sentence(pooled: torch.Tensor, tokens: torch.Tensor, token_logits: torch.Tensor,
                    real: torch.Tensor, beta: float, weighting: str, threshold: float
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """SSA-H's sentence vector, beta * pooled [CLS] + (1 - beta) * the real tokens weighted by
    `hybrid_weights`, and those weights."""
    weights = hybrid_weights(token_logits, real, weighting, threshold)
    mixed = torch.einsum("bt,bth->bh", weights.to(tokens.dtype), tokens)
    return beta * pooled + (1 - beta) * mixed, weights


def ssa_loss(token_logits: torch.Tensor, ssa_labels: torch.Tensor) -> torch.Tensor:
    """Token cross-entropy over labelled positions (label -100: none); exactly 0 when a batch has
    none. Without selecting them: a boolean index, or asking whether any is labelled, reads the
    device back to the host (on a GPU, a wait for every queued kernel at each step). The
    positions are ordered labelled first (a stable sort, so in their own order) and the loss
    skips the rest: the same sum in the same order as over the selected positions, bit for bit."""
    logits, labels = token_logits.flatten(0, -2).float(), ssa_labels.flatten()
    order = torch.argsort((labels == -100).to(torch.uint8), stable=True)
    loss = F.cross_entropy(logits[order], labels[order], ignore_index=-100)
    # no label at all: the mean is 0 / 0, so 0 instead (a NaN of the logits still shows);
    # its gradient is 0 all the same, every position being skipped
    return torch.where((labels != -100).any(), loss, torch.zeros_like(loss))
