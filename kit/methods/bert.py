"""Heads and losses.

`SequenceModel` = a Hugging Face encoder (BERT, RoBERTa, ...; kit.models.backbones loads it) + a
sentence head. The head is the standard pooled-[CLS] classifier/regressor (the paper's BERT-r);
SSA methods add a token importance head, and `ssa-h` feeds the importance-weighted token mix
into the sentence head. kit.models.model_io saves and loads trained models.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from kit import methods
from kit.models.backbones import ModelError


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


# One adapter over the config names of the families (first name present and not None wins).
DROPOUT_NAMES = ("classifier_dropout", "hidden_dropout_prob", "seq_classif_dropout", "dropout",
                 "hidden_dropout", "mlp_dropout")
INIT_RANGE_NAMES = ("initializer_range", "init_std")
NORM_EPS_NAMES = ("layer_norm_eps", "norm_eps", "layer_norm_epsilon")
DEFAULTS = {"dropout": 0.1, "initializer_range": 0.02, "norm_eps": 1e-12}


def config_value(config, names: tuple[str, ...], default: float) -> float:
    """The first of `names` the config sets (not None), else `default`. BERT's
    classifier_dropout None means "use hidden_dropout_prob", hence the order of DROPOUT_NAMES;
    DistilBERT has `seq_classif_dropout` / `dropout`, ModernBERT `classifier_dropout` /
    `mlp_dropout` and `norm_eps`."""
    for name in names:
        value = getattr(config, name, None)
        if value is not None:
            return float(value)
    return default


def head_settings(config) -> dict[str, float]:
    """Dropout, initializer range and norm epsilon of the heads, read from any family's config."""
    return {"dropout": config_value(config, DROPOUT_NAMES, DEFAULTS["dropout"]),
            "initializer_range": config_value(config, INIT_RANGE_NAMES,
                                              DEFAULTS["initializer_range"]),
            "norm_eps": config_value(config, NORM_EPS_NAMES, DEFAULTS["norm_eps"])}


def takes_token_types(backbone) -> bool:
    """Whether token_type_ids should reach the encoder: only if its forward accepts them and it
    has at least two segment embeddings (RoBERTa has 1, DeBERTa-v3 0, DistilBERT and
    ModernBERT take none). Otherwise a tokenizer's segment ids are dropped: a WordPiece
    tokenizer's pair ids (0/1) would index past a one-row table."""
    accepts = "token_type_ids" in inspect.signature(backbone.forward).parameters
    return accepts and (getattr(backbone.config, "type_vocab_size", 0) or 0) >= 2


@dataclass
class HeadSpec:
    num_labels: int
    method: str = "bert"
    beta: float = 0.5
    hybrid_weighting: str = "paper"
    attention_threshold: float = 0.3
    share_weight: bool = True
    max_length: int = 128
    labels: list[str] | None = None    # class names in id order (None: regression, or unknown)


class SequenceModel(nn.Module):
    def __init__(self, backbone, spec: HeadSpec):
        super().__init__()
        self.backbone, self.spec = backbone, spec
        hidden = backbone.config.hidden_size
        settings = head_settings(backbone.config)
        self.token_types = takes_token_types(backbone)
        self.dropout = nn.Dropout(settings["dropout"])
        self.classifier = nn.Linear(hidden, spec.num_labels)
        self.classifier.weight.data.normal_(0.0, settings["initializer_range"])
        self.classifier.bias.data.zero_()
        self.token_head = None
        if methods.get(spec.method).token_head:
            self.token_head = TokenImportanceHead(hidden, spec.max_length, spec.share_weight,
                                                  settings["norm_eps"])

    def forward(self, input_ids, attention_mask, special_mask, token_type_ids=None,
                output_attentions: bool = False) -> dict:
        kwargs = {"token_type_ids": token_type_ids} if (
            token_type_ids is not None and self.token_types) else {}
        out = self.backbone(input_ids=input_ids, attention_mask=attention_mask,
                            output_attentions=output_attentions, **kwargs)
        maps = getattr(out, "attentions", None) if output_attentions else ()
        if output_attentions and (not maps or any(m is None for m in maps)):
            raise ModelError(f"{type(self.backbone).__name__} returned no attention maps "
                             f"(attention implementation "
                             f"{self.backbone.config._attn_implementation!r}); attention guiding "
                             "needs them: use guide_loss 'task' with this model")
        tokens = out.last_hidden_state
        # sentence representation: the pooler (dense + tanh) where the family has one (BERT,
        # RoBERTa, XLM-R), as in BertForSequenceClassification; else the first token's hidden
        # state (ELECTRA, DistilBERT, DeBERTa, ModernBERT: docs/ssa.md)
        pooled = out.pooler_output if getattr(out, "pooler_output", None) is not None else tokens[:, 0]
        token_logits = self.token_head(tokens) if self.token_head is not None else None
        sentence = pooled
        weights = None
        if methods.get(self.spec.method).hybrid:
            real = attention_mask.bool() & ~special_mask
            weights = hybrid_weights(token_logits, real, self.spec.hybrid_weighting,
                                     self.spec.attention_threshold)
            mixed = torch.einsum("bt,bth->bh", weights.to(tokens.dtype), tokens)
            sentence = self.spec.beta * pooled + (1 - self.spec.beta) * mixed
        logits = self.classifier(self.dropout(sentence))
        return {"logits": logits, "token_logits": token_logits, "token_weights": weights,
                "attentions": out.attentions if output_attentions else None}


def target_loss(logits: torch.Tensor, labels: torch.Tensor, regression: bool) -> torch.Tensor:
    if regression:
        return F.mse_loss(logits.squeeze(-1).float(), labels.float())
    return F.cross_entropy(logits.float(), labels)


def ssa_loss(token_logits: torch.Tensor, ssa_labels: torch.Tensor) -> torch.Tensor:
    """Token cross-entropy over labelled positions; exactly 0 when a batch has none."""
    labelled = ssa_labels != -100
    if not labelled.any():
        return token_logits.sum() * 0.0          # keeps the graph, adds nothing
    return F.cross_entropy(token_logits[labelled].float(), ssa_labels[labelled])
