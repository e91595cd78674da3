"""./run_all.sh fetch without a network: the hub's `datasets` / `huggingface_hub` calls faked,
the GLUE files it writes read back by the kit's reader, and a hub id resolved offline
(HF_HUB_OFFLINE=1) from a cache filled in the hub's layout."""
import errno
import json
import os
import shutil
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


def glue_files(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Each file under `folder` (hidden ones too: a temporary folder left behind) -> its bytes
    and mtime."""
    return {str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_an_interrupted_fetch_leaves_no_half_task_and_the_next_writes_it_whole(
        tmp_path, monkeypatch, capsys):
    """The disk fills while the second file is written: nothing of the task is left (no
    train.tsv that the next fetch would keep and a run would read as the whole task)."""
    monkeypatch.setattr(hub, "hub_unreachable", lambda timeout_s=3.0: None)
    written = []
    real_write = Path.write_text

    def full_disk(path, *args, **kwargs):
        written.append(path.name)
        if len(written) == 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return real_write(path, *args, **kwargs)

    with monkeypatch.context() as disk:
        disk.setattr(Path, "write_text", full_disk)
        assert fetch.main(["RTE", "--glue-dir", str(tmp_path)], load=fake_load) == 2
    assert list(tmp_path.iterdir()) == []                   # no RTE/, no temporary folder
    assert len(written) == 2
    err = capsys.readouterr().err
    assert err == (f"error: {tmp_path / 'RTE'}: writing train.tsv, dev.tsv, test.tsv failed (No "
                   "space left on device); none was written, fetch again once that is fixed\n")
    assert fetch.main(["RTE", "--glue-dir", str(tmp_path)], load=fake_load) == 0
    assert capsys.readouterr().out == f"RTE: train 2, dev 1, test 2 rows -> {tmp_path / 'RTE'}\n"
    task = get_task("RTE")
    want = {f"RTE/{s}.tsv": hub.glue_tsv(task, s, hub.split_from_hub(
        task, HUB["rte", h], NAMES["rte"], "x")).encode()
        for s, h in (("train", "train"), ("dev", "validation"), ("test", "test"))}
    assert {k: v[0] for k, v in glue_files(tmp_path).items()} == want


QNLI_TRAIN = {"question": ["Who?", "Where?", "When?"], "sentence": ["Him.", "There.", "Now."],
              "label": [0, 1, 0], "idx": [0, 1, 2]}


def test_a_task_with_missing_splits_gets_them_and_keeps_its_files(tmp_path, monkeypatch, capsys):
    """The project's QNLI holds dev and test but no train: fetch adds train.tsv and leaves the
    two files byte for byte, mtime too; only the missing split is asked of the hub."""
    monkeypatch.setattr(hub, "hub_unreachable", lambda timeout_s=3.0: None)
    (tmp_path / "QNLI").mkdir()
    for split in ("dev", "test"):
        shutil.copy(REPO / "data" / "glue" / "QNLI" / f"{split}.tsv", tmp_path / "QNLI")
        os.utime(tmp_path / "QNLI" / f"{split}.tsv", ns=(10**18, 10**18))
    before = glue_files(tmp_path)
    asked = []

    def qnli(name, config, split):
        asked.append((config, split))
        return FakeSplit(QNLI_TRAIN, ["entailment", "not_entailment"])

    assert fetch.main(["qnli", "--glue-dir", str(tmp_path)], load=qnli) == 0
    assert asked == [("qnli", "train")]
    assert capsys.readouterr().out == (f"QNLI: train 3 rows -> {tmp_path / 'QNLI'} (its dev.tsv, "
                                       "test.tsv kept)\n")
    after = glue_files(tmp_path)
    assert sorted(after) == ["QNLI/dev.tsv", "QNLI/test.tsv", "QNLI/train.tsv"]
    assert {k: after[k] for k in before} == before
    train = read_glue_split(get_task("QNLI"), "train", tmp_path)
    assert train.text_a == QNLI_TRAIN["question"] and train.labels.tolist() == [0, 1, 0]
    assert fetch.main(["QNLI", "--glue-dir", str(tmp_path)], load=qnli) == 0   # now whole
    assert capsys.readouterr().out.startswith("QNLI: kept, its GLUE files are already in ")
    assert asked == [("qnli", "train")] and glue_files(tmp_path) == after


def test_fetch_writes_nothing_where_the_hub_fails_or_a_folder_is_in_the_way(
        tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(hub, "hub_unreachable", lambda timeout_s=3.0: None)

    def no_test_split(name, config, split):
        if split == "test":
            raise ConnectionError("reset by peer")
        return fake_load(name, config, split)
    assert fetch.main(["CoLA", "--glue-dir", str(tmp_path)], load=no_test_split) == 2
    assert "hf://datasets/nyu-mll/glue/cola/test: loading from the hub failed " \
           "(ConnectionError: reset by peer)" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "RTE" / "dev.tsv").mkdir(parents=True)
    assert fetch.main(["RTE", "--glue-dir", str(tmp_path)], load=fake_load) == 2
    assert capsys.readouterr().err == (f"error: {tmp_path / 'RTE' / 'dev.tsv'} (not a file): "
                                       "where fetch writes RTE's GLUE files; move it away and "
                                       "fetch again\n")
    assert [p.name for p in tmp_path.rglob("*")] == ["RTE", "dev.tsv"]


def test_fetch_offline_names_what_is_missing_and_keeps_what_is_whole(tmp_path, capsys):
    """Offline (HF_HUB_OFFLINE=1): a task there whole is kept; the project's QNLI, which lacks
    train.tsv, is one line naming that file and the hub, exit 2, nothing written."""
    project = REPO / "data" / "glue"
    before = glue_files(project / "QNLI")
    assert fetch.main(["RTE"], load=fake_load) == 0
    assert capsys.readouterr().out == (f"RTE: kept, its GLUE files are already in {project / 'RTE'} "
                                       "(delete that folder to fetch it again)\n")
    assert fetch.main(["RTE", "QNLI"], load=fake_load) == 2
    out, err = capsys.readouterr()
    assert out.startswith("RTE: kept") and "QNLI" not in out
    assert err == (f"error: fetching QNLI ({project / 'QNLI' / 'train.tsv'} (absent)) needs the "
                   "Hugging Face hub, which is unreachable (HF_HUB_OFFLINE=1 is set): fetch runs "
                   "where there is a network (a login node), into a folder and HF_HOME the "
                   "compute nodes share\n")
    assert glue_files(project / "QNLI") == before
    assert fetch.main(["RTE", "--glue-dir", str(tmp_path / "g")], load=fake_load) == 2
    assert capsys.readouterr().err.startswith(
        f"error: fetching RTE ({tmp_path / 'g' / 'RTE'}/: train.tsv (absent), dev.tsv (absent), "
        "test.tsv (absent)) needs the Hugging Face hub")
    assert not (tmp_path / "g").exists()


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


# `./run_all.sh plan` (kit.plan's main) in a process of its own, less its batch probe
# (kit.cluster.overhead: a kernel, two runs and a report, three processes importing torch; half
# a minute on a busy 2-core machine), which reads no hub model and which tests/test_plan.py runs
PLAN_WITHOUT_BATCH_PROBE = ("import sys; from kit import plan; "
                            "plan.batch_probe = lambda: plan.NOT_PROBED; "
                            "sys.exit(plan.main(sys.argv[1:]))")


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
    # a process of its own: HF_HOME is read at import
    done = subprocess.run([sys.executable, "-c", PLAN_WITHOUT_BATCH_PROBE, str(profile), "--json",
                           "--budget", "0.2", "--outputs", str(tmp_path / "out")], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=300)
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
