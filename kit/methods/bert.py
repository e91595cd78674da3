"""BERT-r, the paper's vanilla fine-tuning, and the single-task model every single-task method
trains: `SequenceModel` = a Hugging Face encoder (BERT, RoBERTa, ...; kit.models.backbones loads
it) + the standard pooled-[CLS] -> dropout -> linear classifier/regressor. The SSA methods add
their parts (kit.methods.ssa_heads) where their registry row asks: a token-importance head
(`token_head`), SSA-H's importance-weighted token mix in the sentence vector (`hybrid`).
`load_trained` reads a single-task checkpoint folder (the layout: kit.models.model_io).
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from kit import methods
from kit.methods.ssa_heads import TokenImportanceHead, hybrid_sentence
from kit.models.attention_mask import encoder_mask
from kit.models.backbones import ModelError
from kit.models.model_io import load_folder
from kit.models.transformers_adapter import attn_implementation


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
        out = self.backbone(input_ids=input_ids,
                            attention_mask=encoder_mask(self.backbone, attention_mask),
                            output_attentions=output_attentions, **kwargs)
        maps = getattr(out, "attentions", None) if output_attentions else ()
        if output_attentions and (not maps or any(m is None for m in maps)):
            raise ModelError(f"{type(self.backbone).__name__} returned no attention maps "
                             f"(attention implementation "
                             f"{attn_implementation(self.backbone.config)!r}); attention guiding "
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
            sentence, weights = hybrid_sentence(pooled, tokens, token_logits, real, self.spec.beta,
                                                self.spec.hybrid_weighting,
                                                self.spec.attention_threshold)
        logits = self.classifier(self.dropout(sentence))
        return {"logits": logits, "token_logits": token_logits, "token_weights": weights,
                "attentions": out.attentions if output_attentions else None}


def target_loss(logits: torch.Tensor, labels: torch.Tensor, regression: bool,
                weight: torch.Tensor | None = None) -> torch.Tensor:
    """The batch's mean loss; with `weight` (a static shape's batch, kit.data.pipeline.StaticShape:
    0 on its padding rows) the mean over the weighted rows, so padding rows weigh nothing."""
    reduction = "mean" if weight is None else "none"
    if regression:
        loss = F.mse_loss(logits.squeeze(-1).float(), labels.float(), reduction=reduction)
    else:
        loss = F.cross_entropy(logits.float(), labels, reduction=reduction)
    return loss if weight is None else (loss * weight).sum() / weight.sum()


def load_trained(folder: str | Path, eager_attention: bool = False) -> tuple[SequenceModel, object]:
    """(model in eval mode, tokenizer) from a checkpoint folder of a single-task run."""
    return load_folder(folder, HeadSpec, SequenceModel, eager_attention)
