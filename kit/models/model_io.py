"""Saving and loading trained models: the one checkpoint folder layout.

One folder layout for every checkpoint (SequenceModel and the multi-task model alike):
  config.json + model.safetensors   the encoder's config and weights, in the names of the
                                    family's <Family>ForSequenceClassification (`<prefix>.*`)
  tokenizer files                   tokenizer.save_pretrained
  heads.safetensors                 the heads plain transformers has no place for (SSA token
                                    head; ssa-h's and the multi-task heads); absent when none
  head_spec.json                    the HeadSpec / MultiTaskSpec the kit rebuilds the model from
Where the family's own sequence-classification head computes exactly what the kit's head
computes (STANDARD_HEADS), the sentence head is stored under that class's names, so plain
`AutoModelForSequenceClassification.from_pretrained(folder)` predicts what the kit predicts.
Elsewhere config.json's model_type is replaced by a sentence that transformers prints in its
"does not recognize this architecture" error, so the folder never loads with a random head.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import torch

from kit import methods
from kit.models.backbones import ModelError, attn_implementation


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
            "kit.predict or kit.methods.bert.load_trained")


def single_task(model) -> bool:
    """Whether `model` is a single-task model (kit.methods.bert.SequenceModel: one sentence
    head, a HeadSpec), not a multi-task one (kit.methods.embert): its method's registry row."""
    return not methods.get(model.spec.method).multitask


def has_standard_head(model) -> bool:
    """Whether plain transformers can hold this model's sentence head: a single-task model
    whose head is pooled [CLS] -> dropout -> linear (every method but ssa-h), on a family in
    STANDARD_HEADS with a pooler."""
    return (single_task(model) and not methods.get(model.spec.method).hybrid
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
    for key, value in (_label_config(model.spec).items() if single_task(model) else ()):
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
