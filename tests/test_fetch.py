"""./run_all.sh fetch without a network: the hub's `datasets` / `huggingface_hub` calls faked,
the GLUE files it writes read back by the kit's reader, and a hub id resolved offline
(HF_HUB_OFFLINE=1) from a cache filled in the hub's layout."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kit import fetch
from kit.config.tasks import get_task
from kit.data import hub
from kit.data.readers import read_glue_split

REPO = Path(__file__).resolve().parents[1]


class ClassLabel:
    def __init__(self, names):
        self.names = names


class FakeSplit(dict):
    """What datasets.load_dataset returns, as far as the kit reads it: columns and features."""

    def __init__(self, columns, names):
        super().__init__(columns)
        self.features = {"label": ClassLabel(names) if names else object()}

    def __len__(self):
        return len(self["idx"])


HUB = {   # (config, hub split) -> columns; RTE's names as the hub orders them; test: label -1
    ("rte", "train"): {"sentence1": ["A man sleeps.", "It\trains."], "sentence2": ["He rests.",
                       "Dry."], "label": [0, 1], "idx": [0, 1]},
    ("rte", "validation"): {"sentence1": ["x"], "sentence2": ["y"], "label": [1], "idx": [0]},
    ("rte", "test"): {"sentence1": ["p", "q"], "sentence2": ["r", "s"], "label": [-1, -1],
                      "idx": [0, 1]},
    ("cola", "train"): {"sentence": ["Good one .", "One good ."], "label": [1, 0], "idx": [0, 1]},
    ("cola", "validation"): {"sentence": ["Fine ."], "label": [1], "idx": [0]},
    ("cola", "test"): {"sentence": ["Which ?"], "label": [-1], "idx": [0]},
}
NAMES = {"rte": ["entailment", "not_entailment"], "cola": ["unacceptable", "acceptable"]}


def fake_load(name, config, split):
    assert name == "nyu-mll/glue"
    return FakeSplit(HUB[config, split], NAMES[config])


@pytest.mark.parametrize("task", ["RTE", "CoLA"])
def test_fetched_tasks_are_glue_files_the_reader_reads_back(tmp_path, monkeypatch, capsys, task):
    monkeypatch.setattr(hub, "hub_unreachable", lambda timeout_s=3.0: None)
    assert fetch.main([task.lower(), "--glue-dir", str(tmp_path)], load=fake_load) == 0
    config = task.lower()
    sizes = {s: len(HUB[config, h]["idx"]) for s, h in (("train", "train"), ("dev", "validation"),
                                                         ("test", "test"))}
    assert capsys.readouterr().out == (
        f"{task}: train {sizes['train']}, dev {sizes['dev']}, test {sizes['test']} rows -> "
        f"{tmp_path / task}\n")
    info = get_task(task)
    for split, hub_split in (("train", "train"), ("dev", "validation")):
        got = read_glue_split(info, split, tmp_path)
        columns = HUB[config, hub_split]
        first = columns.get("sentence1", columns.get("sentence"))
        assert got.text_a == [t.replace("\t", " ") for t in first]
        assert [info.labels[i] for i in got.labels] == [NAMES[config][i] if task == "RTE"
                                                        else str(i) for i in columns["label"]]
    test = read_glue_split(info, "test", tmp_path)
    assert test.labels is None and len(test) == sizes["test"]


def test_fetch_never_replaces_glue_files_nor_writes_half_a_task(tmp_path, monkeypatch, capsys):
    """A task whose files are there (the project's copy, an earlier fetch) is kept as it is; a
    split the hub fails to give leaves no file of the task written."""
    monkeypatch.setattr(hub, "hub_unreachable", lambda timeout_s=3.0: None)
    (tmp_path / "RTE").mkdir()
    (tmp_path / "RTE" / "train.tsv").write_text("index\tsentence1\tsentence2\tlabel\n")
    assert fetch.main(["RTE", "--glue-dir", str(tmp_path)], load=fake_load) == 0
    assert capsys.readouterr().out == (f"RTE: kept, its GLUE files are already in "
                                       f"{tmp_path / 'RTE'} (delete that folder to fetch it "
                                       "again)\n")
    assert sorted(p.name for p in (tmp_path / "RTE").iterdir()) == ["train.tsv"]

    def no_test_split(name, config, split):
        if split == "test":
            raise ConnectionError("reset by peer")
        return fake_load(name, config, split)
    assert fetch.main(["CoLA", "--glue-dir", str(tmp_path)], load=no_test_split) == 2
    assert "hf://datasets/nyu-mll/glue/cola/test: loading from the hub failed " \
           "(ConnectionError: reset by peer)" in capsys.readouterr().err
    assert not (tmp_path / "CoLA").exists()


def test_fetch_offline_is_one_line_and_writes_nothing(tmp_path, capsys):
    assert fetch.main(["RTE", "--glue-dir", str(tmp_path / "g")], load=fake_load) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: the Hugging Face hub is unreachable (HF_HUB_OFFLINE=1 is set)")
    assert err.count("\n") == 1 and not (tmp_path / "g").exists()


def test_fetch_refuses_what_is_no_glue_task(capsys):
    assert fetch.main(["synthetic"]) == 2
    assert "fetch 'synthetic': not a GLUE task" in capsys.readouterr().err


def cached_model(hf_home: Path, model: str, weights: bool = False) -> Path:
    """The tiny test BERT's config (and with `weights` its random weights) and the embedded
    tokenizer in the hub cache's layout (hub/models--ORG--NAME/snapshots/COMMIT, refs/main
    naming the commit)."""
    from kit.models.backbones import load_backbone
    encoder, tokenizer = load_backbone("tiny")
    repo = hf_home / "hub" / f"models--{model.replace('/', '--')}"
    commit = "0" * 40
    snapshot = repo / "snapshots" / commit
    (encoder if weights else encoder.config).save_pretrained(snapshot)
    tokenizer.save_pretrained(snapshot)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    return snapshot


def test_a_fetched_model_is_found_offline_by_the_plan(tmp_path, monkeypatch, capsys):
    hf_home, model = tmp_path / "hf", "kit-test/tiny-bert"
    monkeypatch.setattr(hub, "hub_unreachable", lambda timeout_s=3.0: None)
    monkeypatch.setenv("HF_HOME", str(hf_home))
    asked = []

    def download(repo_id, allow_patterns):
        asked.append(allow_patterns)
        return str(cached_model(hf_home, repo_id))

    assert fetch.main(["--model", model], download=download) == 0
    assert asked == [fetch.MODEL_FILES, [*fetch.MODEL_FILES, "*.bin"]]   # no safetensors: .bin
    out = capsys.readouterr().out
    assert out.startswith(f"{model} -> {hf_home}/hub/models--kit-test--tiny-bert/snapshots/")
    profile = tmp_path / "offline.yaml"
    profile.write_text(yaml.safe_dump({"grid": {"task": "synthetic", "model": model,
                                                "synthetic_size": 64, "epochs": 1}}))
    env = {**os.environ, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "kit.plan", str(profile), "--json", "--budget",
                           "0.2", "--outputs", str(tmp_path / "out")], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    [point] = result["points"]
    assert point["model"] == model and point["train_rows"] == 64 and point["steps"] == 2
    assert result["probes"][0]["parameters"] > 0
    profile.write_text(yaml.safe_dump({"grid": {"task": "synthetic", "model": "kit-test/absent"}}))
    missing = subprocess.run([sys.executable, "-m", "kit.plan", str(profile)], cwd=REPO, env=env,
                             capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1, missing.stderr
    assert "run `./run_all.sh fetch --model kit-test/absent` on a networked machine" in (
        missing.stderr)
