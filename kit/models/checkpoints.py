"""Load "classic" BERT checkpoints into a Hugging Face BertModel.

Google BERT conversions, StructBERT (AliceMind) and the EmBERT / Bert-n-Pals seed ship as
`bert_config.json` + `vocab.txt` + a raw PyTorch state dict whose keys follow the old
pytorch-pretrained-bert names: a `bert.` prefix, `LayerNorm.gamma` / `LayerNorm.beta`, and
pretraining or task heads (`cls.*`, `classifier.*`) next to the encoder.
"""
from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import torch
from transformers import BertConfig, BertModel, BertTokenizerFast

CONFIG_NAME = "bert_config.json"
VOCAB_NAME = "vocab.txt"
STATE_DICT_SUFFIXES = (".bin", ".pt", ".pth")
REQUIRED_CONFIG_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                        "intermediate_size")
OPTIONAL_CONFIG_KEYS = ("hidden_act", "hidden_dropout_prob", "attention_probs_dropout_prob",
                        "max_position_embeddings", "type_vocab_size", "initializer_range",
                        "layer_norm_eps")
WRAPPER_PREFIXES = ("module.", "model.", "bert.")  # DataParallel, trainer wrappers, BertFor* models
HEAD_PREFIXES = ("cls.", "classifier.")            # pretraining heads, fine-tuned task heads
RENAMES = (("LayerNorm.gamma", "LayerNorm.weight"), ("LayerNorm.beta", "LayerNorm.bias"))


def is_classic_checkpoint(path) -> bool:
    """True for a folder holding `bert_config.json` (the classic layout, not an HF folder)."""
    path = Path(path)
    return path.is_dir() and (path / CONFIG_NAME).is_file()


def classic_files(folder) -> tuple[Path, Path, Path]:
    """(config, vocab, state dict) inside a classic folder. The state dict is
    `pytorch_model.bin`, else the only .bin / .pt / .pth file there."""
    folder = Path(folder)
    weights = [folder / "pytorch_model.bin"]
    if not weights[0].is_file():
        weights = sorted(p for p in folder.iterdir() if p.suffix in STATE_DICT_SUFFIXES)
    if len(weights) != 1:
        found = ", ".join(p.name for p in weights) or "none"
        raise ValueError(f"{folder}: expected one state dict (.bin/.pt/.pth), found {found}; "
                         "pass state_dict_file explicitly")
    for needed in (folder / CONFIG_NAME, folder / VOCAB_NAME):
        if not needed.is_file():
            raise ValueError(f"{folder}: {needed.name} is missing")
    return folder / CONFIG_NAME, folder / VOCAB_NAME, weights[0]


def classic_bert_config(config_file,
                        attn_implementation: str | None = None) -> tuple[BertConfig, list[str]]:
    """BertConfig from a classic json, and the json keys it ignored (e.g. StructBERT's
    `attention_type`)."""
    raw = json.loads(Path(config_file).read_text(encoding="utf-8"))
    absent = [k for k in REQUIRED_CONFIG_KEYS if k not in raw]
    if absent:
        raise ValueError(f"{config_file}: not a BERT config, missing {', '.join(absent)}")
    known = REQUIRED_CONFIG_KEYS + OPTIONAL_CONFIG_KEYS
    config = BertConfig(**{k: raw[k] for k in known if k in raw},
                        attn_implementation=attn_implementation)
    return config, sorted(set(raw) - set(known))


def rename_classic_keys(state_dict: dict) -> tuple[dict, list[str]]:
    """Map classic key names onto the BertModel layout; also return the head keys set aside."""
    renamed, heads = {}, []
    for key, tensor in state_dict.items():
        name = key
        while name.startswith(WRAPPER_PREFIXES):
            name = name.split(".", 1)[1]
        if name.startswith(HEAD_PREFIXES):
            heads.append(key)
            continue
        for old, new in RENAMES:
            if name.endswith(old):
                name = name[: -len(old)] + new
        renamed[name] = tensor
    return renamed, heads


def read_state_dict(path) -> dict:
    """A state dict saved with torch.save, unwrapped from {"state_dict": ...} / {"model": ...}."""
    obj = torch.load(path, map_location="cpu", weights_only=True)
    for wrapper in ("state_dict", "model"):
        if isinstance(obj, dict) and isinstance(obj.get(wrapper), dict):
            obj = obj[wrapper]
    if not isinstance(obj, dict) or not all(torch.is_tensor(v) for v in obj.values()):
        raise ValueError(f"{path}: not a PyTorch state dict (a mapping of names to tensors)")
    return obj


def classic_tokenizer(vocab_file, do_lower_case: bool = True,
                      model_max_length: int = 512) -> BertTokenizerFast:
    """WordPiece tokenizer from a vocab.txt. transformers 5 ignores `vocab_file=` in the
    constructor (it builds an empty vocab), so load it from a folder and check the size."""
    with tempfile.TemporaryDirectory() as folder:
        shutil.copy(vocab_file, Path(folder) / VOCAB_NAME)
        tokenizer = BertTokenizerFast.from_pretrained(
            folder, do_lower_case=do_lower_case, model_max_length=model_max_length)
    with open(vocab_file, encoding="utf-8") as f:
        n_tokens = len({line.rstrip("\n") for line in f})
    if len(tokenizer) != n_tokens:
        raise ValueError(f"{vocab_file}: tokenizer has {len(tokenizer)} tokens, "
                         f"file has {n_tokens}")
    return tokenizer


def load_classic_checkpoint(config_file, vocab_file=None, state_dict_file=None, *,
                            do_lower_case: bool = True, attn_implementation: str | None = None):
    """Load a classic checkpoint: explicit files, or a folder as the only argument.

    Returns (BertModel in eval mode, tokenizer, report). report = {"missing": BertModel keys
    the file lacks (left at their random init, e.g. a pooler), "unexpected": other keys that
    fit no BertModel weight, "unused_heads": `cls.*` / `classifier.*` keys, "ignored_config":
    config keys BertConfig does not take, "files": the three paths}. Pass
    attn_implementation="eager" when attention maps are needed (attention guiding).
    """
    if vocab_file is None and state_dict_file is None:
        config_file, vocab_file, state_dict_file = classic_files(config_file)
    elif vocab_file is None or state_dict_file is None:
        raise ValueError("give a classic folder alone, or config, vocab and state dict files")
    config, ignored = classic_bert_config(config_file, attn_implementation)
    tokenizer = classic_tokenizer(vocab_file, do_lower_case, config.max_position_embeddings)
    if len(tokenizer) > config.vocab_size:
        raise ValueError(f"{vocab_file}: {len(tokenizer)} tokens but {config_file} has "
                         f"vocab_size {config.vocab_size}")

    model = BertModel(config)
    expected = model.state_dict()
    weights, heads = rename_classic_keys(read_state_dict(state_dict_file))
    matched = [k for k in weights if k in expected]
    if not matched:
        sample = ", ".join(list(weights)[:3]) or "no tensors"
        raise ValueError(f"{state_dict_file}: no BERT encoder weights found (keys like {sample})")
    wrong = [f"{k} {tuple(weights[k].shape)} != {tuple(expected[k].shape)}"
             for k in matched if weights[k].shape != expected[k].shape]
    if wrong:
        raise ValueError(f"{state_dict_file}: shapes do not fit {config_file}: {wrong[0]}"
                         + (f" (+{len(wrong) - 1} more)" if len(wrong) > 1 else ""))
    model.load_state_dict({k: weights[k] for k in matched}, strict=False)
    report = {
        "missing": sorted(set(expected) - set(matched)),
        "unexpected": sorted(set(weights) - set(matched)),
        "unused_heads": sorted(heads),
        "ignored_config": ignored,
        "files": {"config": str(config_file), "vocab": str(vocab_file),
                  "state_dict": str(state_dict_file)},
    }
    return model.eval(), tokenizer, report
