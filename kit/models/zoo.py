"""A zoo of tiny random encoders, one per Hugging Face family, saved as local model folders.

Each folder is what a user's `model:` may point at: config.json + weights + a real tokenizer of
the kind the family ships with - WordPiece (BERT, ELECTRA, DistilBERT: the embedded model's
uncased vocabulary), byte-level BPE (RoBERTa, ModernBERT) or SentencePiece-style Unigram
(XLM-RoBERTa, DeBERTa-v2/v3) trained offline with the `tokenizers` library on the project's own
GLUE text. Special tokens follow each family: `<s>`/`</s>`/`<mask>` with the double separator in
pairs and no token_type_ids for RoBERTa and XLM-R, `[CLS]`/`[SEP]`/`[MASK]` elsewhere,
DistilBERT and ModernBERT without token_type_ids. Weights are random (hidden 32, 2 layers):
the folders show that every method runs on every family, not what a family learns.

    python -m kit.models.zoo outputs/zoo          # outputs/zoo/<family>/ for every family

No network: configs are built here, tokenizers trained here.
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from kit.config.paths import PROJECT
from kit.data import readers
from kit.models.backbones import embedded_model_dir
from kit.config.tasks import get_task

GLUE_TEXT = PROJECT / "data" / "glue"
CORPUS_TASKS = ("SST-2", "CoLA", "RTE", "STS-B")   # a mix of short and long sentences
CORPUS_ROWS = 500                                  # first rows of each task's train.tsv
VOCAB_SIZE = 2000                                  # trained BPE / Unigram vocabularies
TINY = {"hidden": 32, "layers": 2, "heads": 2, "intermediate": 64, "positions": 512}

ROBERTA_SPECIALS = {"bos_token": "<s>", "pad_token": "<pad>", "eos_token": "</s>",
                    "unk_token": "<unk>", "mask_token": "<mask>", "cls_token": "<s>",
                    "sep_token": "</s>"}
BERT_SPECIALS = {"pad_token": "[PAD]", "cls_token": "[CLS]", "sep_token": "[SEP]",
                 "unk_token": "[UNK]", "mask_token": "[MASK]"}
NO_TYPES = ["input_ids", "attention_mask"]
WITH_TYPES = ["input_ids", "token_type_ids", "attention_mask"]


def glue_lines(glue_dir: Path = GLUE_TEXT, rows: int = CORPUS_ROWS) -> list[str]:
    """Training text for the tokenizers: the first `rows` sentences (both sides of pairs) of
    several GLUE tasks, read with the project's GLUE reader."""
    lines = []
    for name in CORPUS_TASKS:
        split = readers.read_glue_split(get_task(name), "train", glue_dir)
        lines += list(split.text_a[:rows])
        if split.text_b is not None:
            lines += list(split.text_b[:rows])
    return lines


def _specials_in_order(specials: dict) -> list[str]:
    return list(dict.fromkeys(specials[k] for k in ("bos_token", "cls_token", "pad_token",
                                                   "eos_token", "sep_token", "unk_token",
                                                   "mask_token") if k in specials))


def _wrap(tok, specials: dict, input_names: list[str]):
    """A transformers fast tokenizer around a trained `tokenizers.Tokenizer`, with the
    family's pair template as its post-processor."""
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast
    cls, sep = specials["cls_token"], specials["sep_token"]
    if cls == "<s>":        # RoBERTa / XLM-R: <s> A </s></s> B </s>, one segment id
        tok.post_processor = processors.RobertaProcessing(
            (sep, tok.token_to_id(sep)), (cls, tok.token_to_id(cls)),
            trim_offsets=False, add_prefix_space=False)
    else:                   # BERT-style: [CLS] A [SEP] B [SEP], segment ids 0 / 1
        tok.post_processor = processors.TemplateProcessing(
            single=f"{cls} $A {sep}", pair=f"{cls} $A {sep} $B:1 {sep}:1",
            special_tokens=[(cls, tok.token_to_id(cls)), (sep, tok.token_to_id(sep))])
    return PreTrainedTokenizerFast(tokenizer_object=tok, model_input_names=input_names,
                                   model_max_length=TINY["positions"], **specials)


def byte_bpe_tokenizer(lines: list[str], specials: dict, input_names: list[str]):
    """A byte-level BPE (GPT-2 / RoBERTa / ModernBERT style) trained on `lines`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(lines, trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, special_tokens=_specials_in_order(specials), show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return _wrap(tok, specials, input_names)


def unigram_tokenizer(lines: list[str], specials: dict, input_names: list[str]):
    """A SentencePiece-style Unigram (XLM-R / DeBERTa-v3 style: the ▁ word-start marker)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(lines, trainers.UnigramTrainer(
        vocab_size=VOCAB_SIZE, special_tokens=_specials_in_order(specials),
        unk_token=specials["unk_token"], show_progress=False,
        n_sub_iterations=1, shrinking_factor=0.5))   # 5x faster than the defaults, same size
    return _wrap(tok, specials, input_names)


def wordpiece_tokenizer(input_names: list[str]):
    """The embedded model's uncased WordPiece tokenizer (30,522 tokens)."""
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(embedded_model_dir(), model_input_names=input_names)


def _ids(tokenizer) -> dict:
    return {"vocab_size": len(tokenizer), "pad_token_id": tokenizer.pad_token_id}


def bert_config(tokenizer):
    from transformers import BertConfig
    return BertConfig(**_ids(tokenizer), hidden_size=TINY["hidden"],
                      num_hidden_layers=TINY["layers"], num_attention_heads=TINY["heads"],
                      intermediate_size=TINY["intermediate"],
                      max_position_embeddings=TINY["positions"])


def roberta_config(tokenizer, xlm: bool = False):
    """RoBERTa position ids start after the padding index: 2 more positions than tokens."""
    from transformers import RobertaConfig, XLMRobertaConfig
    kind = XLMRobertaConfig if xlm else RobertaConfig
    return kind(**_ids(tokenizer), bos_token_id=tokenizer.bos_token_id,
                eos_token_id=tokenizer.eos_token_id, type_vocab_size=1,
                hidden_size=TINY["hidden"], num_hidden_layers=TINY["layers"],
                num_attention_heads=TINY["heads"], intermediate_size=TINY["intermediate"],
                max_position_embeddings=TINY["positions"] + 2)


def electra_config(tokenizer):
    """ELECTRA's embeddings are narrower than its layers (a projection between them)."""
    from transformers import ElectraConfig
    return ElectraConfig(**_ids(tokenizer), embedding_size=TINY["hidden"] // 2,
                         hidden_size=TINY["hidden"], num_hidden_layers=TINY["layers"],
                         num_attention_heads=TINY["heads"], intermediate_size=TINY["intermediate"],
                         max_position_embeddings=TINY["positions"])


def distilbert_config(tokenizer):
    from transformers import DistilBertConfig
    return DistilBertConfig(**_ids(tokenizer), dim=TINY["hidden"], n_layers=TINY["layers"],
                            n_heads=TINY["heads"], hidden_dim=TINY["intermediate"],
                            max_position_embeddings=TINY["positions"])


def deberta_v3_config(tokenizer):
    """DeBERTa-v3-base's attention settings: relative positions (buckets), p2c + c2p, a normed
    relative table, no absolute positions, no segment embeddings."""
    from transformers import DebertaV2Config
    return DebertaV2Config(**_ids(tokenizer), hidden_size=TINY["hidden"],
                           num_hidden_layers=TINY["layers"], num_attention_heads=TINY["heads"],
                           intermediate_size=TINY["intermediate"],
                           max_position_embeddings=TINY["positions"], relative_attention=True,
                           position_buckets=16, max_relative_positions=-1,
                           pos_att_type=["p2c", "c2p"], norm_rel_ebd="layer_norm",
                           share_att_key=True, position_biased_input=False, type_vocab_size=0)


def deberta_v2_config(tokenizer):
    """DeBERTa-v2-xlarge's extras over v3: a convolution beside the first layer
    (conv_kernel_size) and absolute position embeddings in the input as well."""
    config = deberta_v3_config(tokenizer)
    config.conv_kernel_size, config.conv_act = 3, "gelu"
    config.position_biased_input = True
    return config


def modernbert_config(tokenizer):
    from transformers import ModernBertConfig
    return ModernBertConfig(**_ids(tokenizer), bos_token_id=tokenizer.cls_token_id,
                            eos_token_id=tokenizer.sep_token_id,
                            cls_token_id=tokenizer.cls_token_id,
                            sep_token_id=tokenizer.sep_token_id, hidden_size=TINY["hidden"],
                            num_hidden_layers=TINY["layers"], num_attention_heads=TINY["heads"],
                            intermediate_size=TINY["intermediate"],
                            max_position_embeddings=TINY["positions"], local_attention=16)


@dataclass(frozen=True)
class Family:
    """How to build one family's folder: its tokenizer (from the corpus lines) and config."""
    tokenizer: Callable[[list[str]], object]
    config: Callable[[object], object]
    tokenizer_kind: str


FAMILIES: dict[str, Family] = {
    "bert": Family(lambda lines: wordpiece_tokenizer(WITH_TYPES), bert_config, "WordPiece"),
    "roberta": Family(lambda lines: byte_bpe_tokenizer(lines, ROBERTA_SPECIALS, NO_TYPES),
                      roberta_config, "byte-level BPE"),
    "xlm-roberta": Family(lambda lines: unigram_tokenizer(lines, ROBERTA_SPECIALS, NO_TYPES),
                          lambda tok: roberta_config(tok, xlm=True), "Unigram"),
    "electra": Family(lambda lines: wordpiece_tokenizer(WITH_TYPES), electra_config, "WordPiece"),
    "distilbert": Family(lambda lines: wordpiece_tokenizer(NO_TYPES), distilbert_config,
                         "WordPiece"),
    "deberta-v3": Family(lambda lines: unigram_tokenizer(lines, BERT_SPECIALS, WITH_TYPES),
                         deberta_v3_config, "Unigram"),
    "deberta-v2": Family(lambda lines: unigram_tokenizer(lines, BERT_SPECIALS, WITH_TYPES),
                         deberta_v2_config, "Unigram"),
    "modernbert": Family(lambda lines: byte_bpe_tokenizer(lines, BERT_SPECIALS, NO_TYPES),
                         modernbert_config, "byte-level BPE"),
}


def build_family(name: str, folder: Path, lines: list[str] | None = None, seed: int = 0) -> Path:
    """Write `folder` = a tiny random `name` encoder + its tokenizer, loadable by
    AutoModel / AutoTokenizer.from_pretrained(folder). Returns the folder."""
    from transformers import AutoModel
    family = FAMILIES[name]
    tokenizer = family.tokenizer(glue_lines() if lines is None else lines)
    torch.manual_seed(seed)
    model = AutoModel.from_config(family.config(tokenizer))
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def build_zoo(root: Path, families: list[str] | None = None) -> dict[str, Path]:
    """Every family's folder under `root` (the GLUE corpus is read once)."""
    lines = glue_lines()
    return {name: build_family(name, Path(root) / name, lines) for name in families or FAMILIES}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kit.models.zoo",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("root", help="folder that receives one sub-folder per family")
    parser.add_argument("--family", action="append", choices=list(FAMILIES),
                        help="build only this family (repeatable); default: all")
    args = parser.parse_args(argv)
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()      # "Writing model shards" bars
    for name, folder in build_zoo(Path(args.root), args.family).items():
        print(f"{name:12s} {FAMILIES[name].tokenizer_kind:15s} {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
