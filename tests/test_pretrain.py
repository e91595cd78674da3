"""Task-adaptive masked-LM pretraining (method mlm, kit.train.pretrain): its config rules and text,
transformers' masking seeded per batch, a run end to end whose folder AutoModelForMaskedLM
loads and a fine-tuning run takes as `model`, and a profile whose fine-tuning point loads the
folder its pretraining point wrote. Resume after a signal: tests/test_preemption.py; 2 processes
(gloo) through the batch runner: tests/test_distributed.py."""
import json
from pathlib import Path
from types import SimpleNamespace

import nbformat
import numpy as np
import pytest
import torch

from kit import batch
from kit import run as krun
from kit.models.backbones import ModelError, load_tokenizer
from kit.config.run_config import ConfigError, RunConfig
from kit.data.pretrain_text import load_text
from kit.methods.mlm import Masker, mask_all
from kit.data.readers import DataError
from kit.runs import checkpoint_dir, run_dir_of
from kit.train.finetune import fit

REPO = Path(__file__).resolve().parents[1]
TINY = dict(task="CoLA", method="mlm", model="tiny", max_train_examples=200, max_length=32,
            epochs=1, lr=5e-3, batch_size=16, report_to=("none",))

pytestmark = pytest.mark.usefixtures("one_thread")      # conftest.py: runs compared across
#                                                         processes need one thread count


# ---------------------------------------------------------------- config and text

@pytest.mark.parametrize("params, needle", [
    (dict(whole_word_mask=True), "parameter 'whole_word_mask': for masked-LM pretraining"),
    (dict(adapted_dir="x"), "parameter 'adapted_dir': for masked-LM pretraining"),
    (dict(method="mlm", predict_test=True), "parameter 'predict_test': method 'mlm' predicts"),
    (dict(method="mlm", mlm_probability=0.0), "'mlm_probability': 0.0 is outside (0, 1)"),
    (dict(method="mlm", max_length=4), "'max_length': 4 is outside [8, 4096]"),
    (dict(method="mlm", guide_loss="task+pd"), "parameter 'guide_loss'"),
    (dict(method="mlm", task="csv", csv_path="a.csv", csv_text_columns=("t",), n_folds=5),
     "parameter 'n_folds': method 'mlm'"),
    (dict(task="csv", csv_path="a.csv", csv_text_columns=("t",)), "needs csv_path, csv_text"),
])
def test_bad_pretraining_parameters_are_one_line(params, needle):
    with pytest.raises(ConfigError) as err:
        RunConfig.from_dict(params)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_text_is_train_then_dev_and_test_with_pretrain_eval_text():
    plain = load_text(RunConfig(**TINY))
    itpt = load_text(RunConfig(**{**TINY, "pretrain_eval_text": True}))
    assert plain.rows() == {"train_rows": 200, "heldout_rows": 1043}
    assert [len(s) for s in itpt.train] == [200, 1043, 1063]           # train, dev, test.tsv
    assert itpt.rows()["heldout_rows"] == 1043


def test_a_csv_without_target_is_pretraining_text(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("id,text\n" + "".join(f"{i},sentence number {i} here\n" for i in range(20))
                    + "20,\n")
    text = load_text(RunConfig(method="mlm", task="csv", csv_path=str(path),
                               csv_text_columns=("text",)))
    assert text.rows() == {"train_rows": 16, "heldout_rows": 4}       # seeded 80/20, blank dropped


@pytest.mark.parametrize("body, needle", [
    ("id,text\n1,\n2,  \n3,\n", "no text to pretrain on in column(s) 'text'"),
    ("id,other\n1,a\n", "no column 'text'"),
])
def test_bad_text_stops_the_batch_before_any_kernel(tmp_path, body, needle):
    path = tmp_path / "t.csv"
    path.write_text(body)
    profile = tmp_path / "p.yaml"
    profile.write_text(f"grid:\n  task: csv\n  method: mlm\n  model: tiny\n  csv_path: {path}\n"
                       "  csv_text_columns: text\n")
    loaded = batch.load_profile(str(profile), str(tmp_path / "out"))
    with pytest.raises(DataError) as err:
        batch.preflight(loaded, loaded.points)
    assert needle in str(err.value) and "\n" not in str(err.value)


# ---------------------------------------------------------------- masking

def _batch(tokenizer, texts):
    enc = tokenizer(texts, return_special_tokens_mask=True, return_offsets_mapping=True,
                    padding=True, return_tensors="pt")
    return enc["input_ids"], enc["special_tokens_mask"].bool(), enc["offset_mapping"]


def test_masking_is_transformers_recipe_and_follows_its_seed():
    tokenizer = load_tokenizer("tiny")
    ids, special, _ = _batch(tokenizer, ["the quick brown fox jumps over the lazy dog"] * 400)
    masker = Masker(tokenizer, 0.15, whole_word=False)
    masked, labels = masker(ids, special, None, seed=7)
    again, _ = masker(ids, special, None, seed=7)
    other, _ = masker(ids, special, None, seed=8)
    assert torch.equal(masked, again) and not torch.equal(masked, other)
    chosen = labels != -100
    assert not chosen[special].any()                         # [CLS], [SEP], padding: never
    assert abs(chosen.sum() / (~special).sum() - 0.15) < 0.02
    assert torch.equal(labels[chosen], ids[chosen])
    share = (masked[chosen] == tokenizer.mask_token_id).float().mean()
    kept = (masked[chosen] == ids[chosen]).float().mean()
    assert abs(share - 0.8) < 0.04 and abs(kept - 0.1) < 0.04    # 80 / 10 / 10
    state = torch.get_rng_state()
    masker(ids, special, None, seed=9)
    assert torch.equal(state, torch.get_rng_state())       # the run's own RNG is untouched


def test_whole_word_masking_masks_every_piece_of_a_word():
    tokenizer = load_tokenizer("tiny")
    ids, special, offsets = _batch(tokenizer, ["unbelievably tokenization happens"] * 200)
    pieces = tokenizer.convert_ids_to_tokens(ids[0])
    assert pieces[1:8] == ["un", "##bel", "##ie", "##va", "##bly", "token", "##ization"]
    masker = Masker(tokenizer, 0.3, whole_word=True)
    _, labels = masker(ids, special, offsets, seed=1)
    chosen = labels != -100
    for word in ([1, 2, 3, 4, 5], [6, 7], [8]):         # a word is masked whole or not at all
        assert chosen[:, word].any()
        assert (chosen[:, word].all(1) == chosen[:, word].any(1)).all()
    assert abs(chosen[:, 8].float().mean() - 0.3) < 0.1


def test_heldout_masks_are_drawn_once_per_seed():
    tokenizer = load_tokenizer("tiny")
    rows = [np.asarray(tokenizer(f"sentence {i} " * (1 + i % 5))["input_ids"]) for i in range(50)]
    special = [np.isin(r, tokenizer.all_special_ids) for r in rows]
    masker = Masker(tokenizer, 0.15, whole_word=False)
    a, b, c = (mask_all(masker, rows, special, None, 0, seed=s, chunk=16) for s in (0, 0, 1))
    assert all(np.array_equal(x, y) for x, y in zip(a[1], b[1]))            # every epoch alike
    assert not all(np.array_equal(x, y) for x, y in zip(a[1], c[1]))
    assert [len(x) for x in a[0]] == [len(r) for r in rows]


# ---------------------------------------------------------------- runs

def test_pretrain_then_fine_tune_the_adapted_folder(tmp_path):
    """metrics.json: masked-LM loss and perplexity per epoch, the new head reported; the folder
    loads in plain transformers (head and the original pooler) and as a fine-tuning `model`;
    pretraining that folder again finds its head."""
    from transformers import AutoModel, AutoModelForMaskedLM
    adapted = tmp_path / "adapted" / "tiny-CoLA"
    cfg = RunConfig(**{**TINY, "epochs": 2}, adapted_dir=str(adapted), outputs_dir=str(tmp_path))
    metrics = fit(cfg)
    assert metrics["status"] == "ok" and len(metrics["epochs"]) == 2
    for epoch in metrics["epochs"]:
        dev = epoch["dev"]
        assert set(dev) == {"mlm_loss", "perplexity", "score"} and epoch["train_loss"] > 0
        assert dev["perplexity"] == pytest.approx(np.exp(dev["mlm_loss"]))
    assert metrics["mlm_head_initialised"] is True
    assert "cls.predictions.transform.dense.weight" in metrics["mlm_head_new_weights"]
    assert metrics["adapted_dir"] == str(adapted.resolve())
    lm, info = AutoModelForMaskedLM.from_pretrained(adapted, output_loading_info=True)
    assert not info["missing_keys"]
    encoder, info = AutoModel.from_pretrained(adapted, output_loading_info=True)
    assert not info["missing_keys"]                          # the pooler came along
    best = checkpoint_dir(run_dir_of(cfg)) / "best"
    assert (best / "model.safetensors").read_bytes() == (adapted / "model.safetensors").read_bytes()

    tuned = fit(RunConfig(task="CoLA", model=str(adapted), max_train_examples=64, epochs=1,
                          lr=5e-3, report_to=("none",), outputs_dir=str(tmp_path)))
    assert tuned["status"] == "ok" and "mcc" in tuned["best_dev"]
    again = fit(RunConfig(**{**TINY, "model": str(adapted)}, outputs_dir=str(tmp_path)))
    assert again["mlm_head_initialised"] is False and again["mlm_head_new_weights"] == []


def test_a_missing_adapted_folder_is_one_line(tmp_path):
    missing = tmp_path / "adapted" / "never-written"
    with pytest.raises(ModelError) as err:
        fit(RunConfig(task="CoLA", model=str(missing), outputs_dir=str(tmp_path)))
    assert f"model folder {str(missing)!r} does not exist" in str(err.value)
    assert "\n" not in str(err.value)


def test_whole_word_masking_run_without_checkpoints(tmp_path):
    """The best weights kept in memory reach adapted_dir too."""
    adapted = tmp_path / "adapted"
    cfg = RunConfig(**{**TINY, "max_train_examples": 64}, whole_word_mask=True,
                    save_checkpoints=False, adapted_dir=str(adapted), outputs_dir=str(tmp_path))
    metrics = fit(cfg)
    assert metrics["status"] == "ok" and np.isfinite(metrics["best_dev"]["mlm_loss"])
    assert (adapted / "model.safetensors").exists() and (adapted / "tokenizer.json").exists()
    assert not checkpoint_dir(run_dir_of(cfg)).exists()
    assert not list(tmp_path.glob(".adapted.*"))          # the temp folder was swapped in


@pytest.mark.parametrize("whole_word", [False, True])
@pytest.mark.parametrize("buckets", ["off", "on"])
def test_every_masking_trains_with_length_buckets_and_reads_nothing_back_per_step(
        tmp_path, monkeypatch, whole_word, buckets):
    """Masks are drawn on the host before the batch's copy (Pretrain.on_host): a step reads
    nothing from the device, and whole-word masking takes a length bucket's padding (its
    offsets padded to the bucket, not the longest row: 16 vs 8 broadcast failed before)."""
    from kit.train import loop
    from kit.train.pretrain import Pretrain
    from tests.host_reads import HostReads
    counter, real_step, shapes = HostReads(), loop.train_step, []

    def step(*args, **kwargs):
        counter.mark("step")
        return real_step(*args, **kwargs)

    def masked(job, batch, t, real=Pretrain.on_host):   # host tensors: reading them is free
        counter.mark("host")
        out = real(job, batch, t)
        shapes.append(tuple(out["labels"].shape) == tuple(out["input_ids"].shape))
        return out
    monkeypatch.setattr(loop, "train_step", step)
    monkeypatch.setattr(Pretrain, "on_host", masked)
    cfg = RunConfig(**{**TINY, "max_train_examples": 64}, whole_word_mask=whole_word,
                    length_buckets=buckets, log_every=100, save_checkpoints=False,
                    outputs_dir=str(tmp_path))
    with counter:
        metrics = fit(cfg)
    assert metrics["status"] == "ok" and metrics["length_buckets"] == buckets
    assert np.isfinite(metrics["best_dev"]["mlm_loss"]) and shapes == [True] * 4
    steps = [reads for label, reads in counter.segments() if label == "step"]
    assert len(steps) == 4 and steps[:-1] == [[]] * 3       # the last step reads its window


# ---------------------------------------------------------------- notebook and profile

def test_pretrain_notebook_is_thin_and_its_parameters_are_fields():
    nb = nbformat.read(REPO / "notebooks" / "pretrain.ipynb", as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    tagged = [c for c in code if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1 and nb.cells[0].cell_type == "markdown"
    assert all(not c.outputs and c.execution_count is None for c in code)
    assert not any(line.lstrip().startswith(("def ", "class ")) for c in code
                   for line in c.source.splitlines())
    names = [line.split("=")[0].strip() for line in tagged[0].source.splitlines()
             if "=" in line and not line.startswith("#")]
    # RunConfig fields, once each (tests/test_run.py checks the cell's names and defaults)
    assert len(names) == len(set(names)) and set(names) <= set(RunConfig.__dataclass_fields__)
    finetune = nbformat.read(REPO / "notebooks" / "finetune.ipynb", as_version=4)
    assert nb.metadata == finetune.metadata


def test_the_smoke_profile_chains_its_points_through_one_folder(tmp_path):
    profile = batch.load_profile("tapt-smoke", str(tmp_path))
    pre, tune = (RunConfig.from_dict(p) for p in profile.points)
    assert pre.method == "mlm" and tune.method == "bert"
    assert pre.adapted_dir == tune.model == str(tmp_path.resolve() / "adapted" / "minilm-tapt-CoLA")
    assert [profile.notebook_for(c).name for c in (pre, tune)] == ["pretrain.ipynb",
                                                                   "finetune.ipynb"]
    assert krun.notebook_for(pre, None).name == "pretrain.ipynb"       # kit.run's default


TAPT_TINY = """
notebook: auto
grid:
  - &pretrain
    {task: CoLA, method: mlm, model: tiny, max_train_examples: 64, max_length: 32, epochs: 1,
     lr: 5.0e-3, report_to: none, adapted_dir: "{outputs}/adapted/tiny-tapt-CoLA"}
  - {<<: *pretrain, method: bert, model: "{outputs}/adapted/tiny-tapt-CoLA", adapted_dir: ""}
"""


def test_a_model_folder_no_earlier_point_writes_stops_the_batch_before_any_kernel(tmp_path):
    """The fine-tuning point's folder is written by the point before it: pre-flight lets it
    through; in the other order, or misspelt, it is one line now, not a failed run later."""
    profile = tmp_path / "tapt.yaml"
    for text, bad in [(TAPT_TINY, None),
                      (TAPT_TINY.replace("CoLA\", adapted_dir", "CLA\", adapted_dir"), "tiny-tapt-CLA"),
                      (TAPT_TINY.replace("grid:", "grid:\n  - {task: CoLA, model: "
                                         "\"{outputs}/adapted/tiny-tapt-CoLA\"}"),
                       "tiny-tapt-CoLA")]:
        profile.write_text(text)
        loaded = batch.load_profile(str(profile), str(tmp_path / "out"))
        if bad is None:
            assert batch.preflight(loaded, loaded.points) == {}
            continue
        with pytest.raises(ModelError) as err:
            batch.preflight(loaded, loaded.points)
        missing = tmp_path.resolve() / "out" / "adapted" / bad
        assert str(err.value) == (f"model folder {str(missing)!r} does not exist ({missing}); "
                                  "build or copy it there, or give a hub id (organisation/name)")


def test_a_profile_pretrains_then_fine_tunes_in_one_warm_kernel(tmp_path, capsys,
                                                               batch_kernel):
    """tapt-smoke's shape on the tiny model: the points run in order, each through its own
    notebook (`notebook: auto`), the second on the folder the first wrote."""
    profile = tmp_path / "tapt.yaml"
    profile.write_text(TAPT_TINY)
    out = tmp_path / "out"
    assert batch.run_profile(str(profile), outputs_dir=str(out), report=False) == 0
    assert "2 ok, 0 skipped, 0 failed" in capsys.readouterr().out
    pre, tune = (RunConfig.from_dict(p) for p in batch.load_profile(str(profile), str(out)).points)
    assert json.loads((run_dir_of(tune) / "metrics.json").read_text())["model"] == pre.adapted_dir
    executed = json.loads((run_dir_of(pre) / "notebook.ipynb").read_text())
    assert executed["cells"][0]["source"][0].startswith("# Task-adaptive pretraining")


class _FailsOnTheSecondForward(torch.nn.Module):
    """A masked-LM stand-in whose second forward raises, as an out-of-memory error would; it
    records the mode each forward ran in."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(()))
        self.lm = SimpleNamespace(config=SimpleNamespace(vocab_size=8))
        self.modes = []

    def forward(self, input_ids, attention_mask, masked, **_):
        self.modes.append(self.training)
        if len(self.modes) == 2:
            raise RuntimeError("out of memory")
        return torch.zeros(len(masked), 8)      # the masked positions' logits


def test_an_error_inside_the_heldout_pass_leaves_the_model_training():
    """heldout_loss runs in eval mode and puts the model back in the mode it came in whatever
    ends the pass (as step.predict_logits does): a run that catches the error, or resumes after
    a stop inside the pass, trains with dropout again."""
    from kit.data.pipeline import Examples
    from kit.train.pretrain import heldout_loss
    rows = [np.array([1, 5, 6, 2]), np.array([1, 7, 2])]
    examples = Examples(rows, None, [np.zeros(len(r), bool) for r in rows], np.zeros(2))
    labels = [np.array([-100, 5, -100, -100]), np.array([-100, 7, -100])]
    model = _FailsOnTheSecondForward().train()
    with pytest.raises(RuntimeError, match="out of memory"):
        heldout_loss(model, examples, rows, labels, pad_id=0, batch_size=1)
    assert model.modes == [False, False]          # both forwards in eval mode
    assert model.training
