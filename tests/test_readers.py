"""Tests of kit.data.readers, kit.data.hub and kit.data.csv_reader on the real GLUE files, on small fixtures
and on broken files.

The real files (GLUE_DIR, see conftest.py) are checked against the counts in SOURCES.md.
MRPC, MNLI and QQP are not staged, so tests/fixtures/glue holds 5-6 row files in their exact
GLUE layouts (MRPC train/dev with the BOM). Copied from public GLUE samples: the MRPC dev rows
and first five MRPC train rows, the MNLI dev_matched texts and labels (row 0 verbatim), the
first five QQP dev rows and first two QQP train rows. The other rows are written by hand in
the same format, among them rows with an unbalanced `"` and the texts "null" and "NA"; MNLI
parse columns other than dev_matched row 0 are right-branching stand-ins.
"""
import csv
import math
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kit.data.csv_reader import read_csv_split
from kit.data.hub import read_hub_split, split_from_hub
from kit.data.readers import DataError, read_glue_split
from kit.config.tasks import GLUE_TASKS

FIXTURES = Path(__file__).parent / "fixtures" / "glue"


def label_counts(task_name, split):
    task = GLUE_TASKS[task_name]
    return dict(Counter(task.labels[i] for i in split.labels))


# --------------------------------------------------------------------------- real GLUE files

# (task, split, rows, label counts) from SOURCES.md; None = test file without labels.
REAL = [
    ("CoLA", "train", 8551, {"1": 6023, "0": 2528}),
    ("CoLA", "dev", 1043, {"1": 721, "0": 322}),
    ("CoLA", "test", 1063, None),
    ("SST-2", "train", 67349, {"1": 37569, "0": 29780}),
    ("SST-2", "dev", 872, {"1": 444, "0": 428}),
    ("SST-2", "test", 1821, None),
    ("QNLI", "dev", 5463, {"entailment": 2702, "not_entailment": 2761}),
    ("QNLI", "test", 5463, None),
    ("RTE", "train", 2490, {"entailment": 1249, "not_entailment": 1241}),
    ("RTE", "dev", 277, {"entailment": 146, "not_entailment": 131}),
    ("RTE", "test", 3000, None),
    ("WNLI", "train", 635, {"0": 323, "1": 312}),
    ("WNLI", "dev", 71, {"0": 40, "1": 31}),
    ("WNLI", "test", 146, None),
]


@pytest.mark.parametrize("task_name,split,rows,counts", REAL)
def test_real_classification_files(glue_dir, task_name, split, rows, counts):
    task = GLUE_TASKS[task_name]
    s = read_glue_split(task, split, glue_dir)
    assert len(s) == len(s.ids) == rows
    assert (s.text_b is None) == (not task.is_pair)
    assert s.source == str(glue_dir / task_name / f"{split}.tsv")
    if counts is None:
        assert s.labels is None
    else:
        assert s.labels.dtype == np.int64
        assert label_counts(task_name, s) == counts


@pytest.mark.parametrize("split,rows", [("train", 5749), ("dev", 1500), ("test", 1379)])
def test_real_stsb(glue_dir, split, rows):
    s = read_glue_split(GLUE_TASKS["STS-B"], split, glue_dir)
    assert len(s) == len(s.text_b) == rows
    if split == "test":
        assert s.labels is None
    else:
        assert s.labels.dtype == np.float32
        assert s.labels.min() == 0.0 and s.labels.max() == 5.0
    if split == "dev":
        assert (s.text_a[0], s.text_b[0], s.labels[0]) == (
            "A man with a hard hat is dancing.", "A man wearing a hard hat is dancing.", 5.0)


def test_real_quote_rows_are_not_merged(glue_dir):
    rte = read_glue_split(GLUE_TASKS["RTE"], "train", glue_dir)
    row = rte.ids.index("2164")
    assert rte.text_a[row].startswith('"That film wasn\'t too successful')
    assert rte.text_b[row] == 'The film "WarGames" was shot in 1983.'
    assert rte.ids[row + 1] == "2165"

    qnli = read_glue_split(GLUE_TASKS["QNLI"], "dev", glue_dir)
    assert qnli.ids == [str(i) for i in range(5463)]
    quoted = {int(i) for i, text in zip(qnli.ids, qnli.text_b) if text.startswith('" ')}
    assert {694, 3428, 3479, 3529, 4080} <= quoted
    assert len(quoted) == 13          # SOURCES.md names five; the file has thirteen


def test_real_cola_layouts(glue_dir):
    dev = read_glue_split(GLUE_TASKS["CoLA"], "dev", glue_dir)
    assert dev.text_a[0] == "The sailors rode the breeze clear of the rocks."
    assert dev.text_a[-1] == "John talked to Bill about himself."   # no final newline
    assert dev.ids[-1] == "1042"                                      # row numbers: no index
    test = read_glue_split(GLUE_TASKS["CoLA"], "test", glue_dir)
    assert (test.ids[0], test.text_a[0]) == ("0", "Bill whistled past the house.")
    # Backspace characters inside sentences must not end a line.
    train = read_glue_split(GLUE_TASKS["CoLA"], "train", glue_dir)
    assert "\x08" in train.text_a[7129]


def test_real_sst2_keeps_text_verbatim(glue_dir):
    s = read_glue_split(GLUE_TASKS["SST-2"], "dev", glue_dir)
    assert s.text_a[0] == "it 's a charming and often affecting journey . "
    assert s.ids[:3] == ["0", "1", "2"]


# --------------------------------------------------------------------------- fixtures

def test_mrpc_fixture():
    task = GLUE_TASKS["MRPC"]
    assert (FIXTURES / "MRPC" / "train.tsv").read_bytes().startswith(b"\xef\xbb\xbf")
    train = read_glue_split(task, "train", FIXTURES)
    assert len(train) == 6 and label_counts("MRPC", train) == {"1": 4, "0": 2}
    assert train.text_a[0].startswith("Amrozi accused his brother")
    assert train.ids == [str(i) for i in range(6)]
    dev = read_glue_split(task, "dev", FIXTURES)
    assert dev.labels.tolist() == [1, 0, 0, 1, 0, 1]
    assert dev.text_b[0].startswith('" The foodservice pie business')   # unbalanced quote
    test = read_glue_split(task, "test", FIXTURES)
    assert test.labels is None and test.ids == ["0", "1", "2", "3", "4"]
    assert test.text_b[4].startswith("But company officials")


def test_mnli_fixture():
    task = GLUE_TASKS["MNLI"]
    train = read_glue_split(task, "train", FIXTURES)
    assert len(train) == 6
    assert label_counts("MNLI", train) == {"neutral": 2, "entailment": 3, "contradiction": 1}
    assert train.text_a[5] == '"Not that one, he said.'
    dev_m = read_glue_split(task, "dev_matched", FIXTURES)
    # gold_label, not label1: row 0 is annotated neutral, entailment, neutral, ... -> neutral.
    assert [task.labels[i] for i in dev_m.labels] == [
        "neutral", "contradiction", "entailment", "contradiction", "contradiction"]
    assert dev_m.text_b[0] == "Everyone really likes the newest benefits "
    dev_mm = read_glue_split(task, "dev_mismatched", FIXTURES)
    assert label_counts("MNLI", dev_mm) == {"contradiction": 3, "entailment": 2}
    test = read_glue_split(task, "test_matched", FIXTURES)
    assert test.labels is None and len(test) == 5 and test.ids[0] == "0"
    assert test.text_a[0].startswith("Hierbas, ans seco")


def test_qqp_fixture_keeps_na_text():
    task = GLUE_TASKS["QQP"]
    train = read_glue_split(task, "train", FIXTURES)
    assert train.ids[:2] == ["133273", "402555"]
    assert label_counts("QQP", train) == {"0": 4, "1": 2}
    assert (train.text_a[5], train.text_b[5]) == ("null", 'What does "null mean in SQL?')
    dev = read_glue_split(task, "dev", FIXTURES)
    assert dev.text_b[5] == "NA" and dev.labels.tolist() == [0, 0, 1, 0, 0, 0]
    test = read_glue_split(task, "test", FIXTURES)
    assert test.labels is None and test.ids == ["0", "1", "2", "3", "4"]
    assert test.text_b[0] == "Why are rockets and boosters painted white?"


def test_missing_split_file_names_path():
    with pytest.raises(DataError, match=r"MNLI/test_mismatched\.tsv does not exist.*GLUE_DIR"):
        read_glue_split(GLUE_TASKS["MNLI"], "test_mismatched", FIXTURES)


# --------------------------------------------------------------------------- broken files

RTE_HEADER = "index\tsentence1\tsentence2\tlabel\n"


def write_glue(tmp_path, task, split, content):
    """Write glue_dir/<task>/<split>.tsv (str is written as UTF-8, bytes as given)."""
    path = tmp_path / task / f"{split}.tsv"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    return path


def read_error(tmp_path, task_name, split="train"):
    with pytest.raises(DataError) as err:
        read_glue_split(GLUE_TASKS[task_name], split, tmp_path)
    message = str(err.value)
    assert "\n" not in message
    return message


def test_wrong_field_count_names_line(tmp_path):
    path = write_glue(tmp_path, "RTE", "train",
                      RTE_HEADER + "0\ta\tb\tentailment\n1\ta\tb\textra\tentailment\n")
    message = read_error(tmp_path, "RTE")
    assert f"{path}: line 3:" in message and "expected 4" in message and "got 5" in message


def test_wrong_field_count_in_headerless_cola(tmp_path):
    path = write_glue(tmp_path, "CoLA", "train", "gj04\t1\t\tFine.\ngj04\t1\tToo few.\n")
    assert f"{path}: line 2:" in read_error(tmp_path, "CoLA")


def test_unknown_label_names_line_value_and_allowed(tmp_path):
    path = write_glue(tmp_path, "RTE", "dev",
                      RTE_HEADER + "0\ta\tb\tentailment\n1\ta\tb\tcontradiction\n")
    message = read_error(tmp_path, "RTE", "dev")
    assert f"{path}: line 3:" in message
    assert "'contradiction'" in message and "'entailment', 'not_entailment'" in message


def test_bom_before_any_header_is_dropped(tmp_path):
    write_glue(tmp_path, "RTE", "train",
               b"\xef\xbb\xbf" + (RTE_HEADER + "7\ta\tb\tnot_entailment\n").encode())
    s = read_glue_split(GLUE_TASKS["RTE"], "train", tmp_path)
    assert s.ids == ["7"] and s.labels.tolist() == [1]


def test_crlf_line_ends(tmp_path):
    crlf = RTE_HEADER.replace("\n", "\r\n") + "0\ta\tb\tentailment\r\n"
    write_glue(tmp_path, "RTE", "train", crlf)
    s = read_glue_split(GLUE_TASKS["RTE"], "train", tmp_path)
    assert s.text_b == ["b"] and s.labels.tolist() == [0]


@pytest.mark.parametrize("content", ["", "\n\n"])
def test_empty_file(tmp_path, content):
    path = write_glue(tmp_path, "WNLI", "train", content)
    message = read_error(tmp_path, "WNLI")
    assert str(path) in message and "empty" in message


def test_header_only_file(tmp_path):
    path = write_glue(tmp_path, "WNLI", "dev", RTE_HEADER)
    assert f"{path}: the file has a header but no rows" in read_error(tmp_path, "WNLI", "dev")


def test_non_utf8_bytes_name_line(tmp_path):
    path = write_glue(tmp_path, "SST-2", "train",
                      b"sentence\tlabel\ngood .\t1\ncaf\xe9 noir .\t0\n")
    message = read_error(tmp_path, "SST-2")
    assert f"{path}: line 3:" in message and "UTF-8" in message


def test_missing_header_column(tmp_path):
    path = write_glue(tmp_path, "QNLI", "dev",
                      "index\tquestion\ttext\tlabel\n0\tq\ts\tentailment\n")
    message = read_error(tmp_path, "QNLI", "dev")
    assert str(path) in message and "'sentence'" in message


STSB_HEADER = "\t".join(["index", "genre", "filename", "year", "old_index", "source1", "source2",
                         "sentence1", "sentence2", "score"]) + "\n"


@pytest.mark.parametrize("score,problem", [
    ("nan", "not a number from 0 to 5"), ("5.2", "not a number from 0 to 5"),
    ("", "is not a number"), ("high", "is not a number")])
def test_bad_stsb_score_names_line(tmp_path, score, problem):
    row = "\tmain-captions\tMSRvid\t2012test\t0000\tnone\tnone\tA man.\tA man.\t"
    path = write_glue(tmp_path, "STS-B", "dev",
                      STSB_HEADER + "0" + row + "4.0\n1" + row + score + "\n")
    message = read_error(tmp_path, "STS-B", "dev")
    assert f"{path}: line 3:" in message and problem in message


def test_missing_folders(tmp_path):
    with pytest.raises(DataError, match=r"GLUE folder .*nowhere does not exist") as err:
        read_glue_split(GLUE_TASKS["RTE"], "train", tmp_path / "nowhere")
    assert "glue_dir=" in str(err.value) and "GLUE_DIR" in str(err.value)
    with pytest.raises(DataError, match=r"RTE does not exist \(no RTE/ subfolder.*GLUE_DIR"):
        read_glue_split(GLUE_TASKS["RTE"], "train", tmp_path)


def test_unknown_split_lists_choices(glue_dir):
    with pytest.raises(DataError, match="dev_matched, dev_mismatched"):
        read_glue_split(GLUE_TASKS["MNLI"], "dev", glue_dir)


# --------------------------------------------------------------------------- hub

def test_hub_mnli_labels_are_remapped():
    task = GLUE_TASKS["MNLI"]
    data = {"premise": ["p0", "p1", "p2"], "hypothesis": ["h0", "h1", "h2"],
            "label": [0, 1, 2], "idx": [10, 11, 12]}
    s = split_from_hub(task, data, ["entailment", "neutral", "contradiction"], "hub:mnli")
    assert [task.labels[i] for i in s.labels] == ["entailment", "neutral", "contradiction"]
    assert s.labels.dtype == np.int64
    assert s.text_a == ["p0", "p1", "p2"] and s.text_b == ["h0", "h1", "h2"]
    assert s.ids == ["10", "11", "12"]


def test_hub_word_labels_keep_class_ids():
    datasets = pytest.importorskip("datasets")
    features = datasets.Features({
        "sentence1": datasets.Value("string"), "sentence2": datasets.Value("string"),
        "label": datasets.ClassLabel(names=["not_entailment", "entailment"]),
        "idx": datasets.Value("int32")})
    data = datasets.Dataset.from_dict(
        {"sentence1": ["a", "b"], "sentence2": ["c", "d"], "label": [1, 0], "idx": [0, 1]},
        features=features)
    s = split_from_hub(GLUE_TASKS["WNLI"], data, data.features["label"].names, "hub:wnli")
    assert s.labels.tolist() == [1, 0]      # GLUE WNLI files: 1 = entailment, as on the hub
    assert s.text_b == ["c", "d"]


def test_hub_test_labels_and_regression():
    hidden = {"sentence": ["x", "y"], "label": [-1, -1], "idx": [0, 1]}
    cola = split_from_hub(GLUE_TASKS["CoLA"], hidden, ["unacceptable", "acceptable"], "hub")
    assert cola.labels is None and cola.text_a == ["x", "y"]
    stsb = {"sentence1": ["a", "b"], "sentence2": ["c", "d"], "label": [4.75, 0.0], "idx": [0, 1]}
    s = split_from_hub(GLUE_TASKS["STS-B"], stsb, None, "hub:stsb")
    assert s.labels.dtype == np.float32 and s.labels.tolist() == [4.75, 0.0]
    stsb["label"] = [-1.0, -1.0]
    assert split_from_hub(GLUE_TASKS["STS-B"], stsb, None, "hub:stsb").labels is None


def test_hub_bad_label_id_names_row():
    data = {"sentence1": ["a", "b"], "sentence2": ["c", "d"], "label": [0, 3], "idx": [0, 1]}
    with pytest.raises(DataError, match=r"hub:rte: row 1: hub label id 3"):
        split_from_hub(GLUE_TASKS["RTE"], data, ["entailment", "not_entailment"], "hub:rte")


def test_hub_reader_asks_for_the_hub_split_and_remaps(monkeypatch):
    """The networked path with `load_dataset` stubbed: split names and label order."""
    datasets = pytest.importorskip("datasets")
    calls = []

    def fake_load_dataset(name, config, split):
        calls.append((name, config, split))
        features = datasets.Features({
            "premise": datasets.Value("string"), "hypothesis": datasets.Value("string"),
            "label": datasets.ClassLabel(names=["entailment", "neutral", "contradiction"]),
            "idx": datasets.Value("int32")})
        return datasets.Dataset.from_dict(
            {"premise": ["p"], "hypothesis": ["h"], "label": [2], "idx": [7]}, features=features)

    monkeypatch.setattr("kit.data.hub.hub_unreachable", lambda: None)
    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    s = read_hub_split(GLUE_TASKS["MNLI"], "dev_mismatched")
    assert calls == [("nyu-mll/glue", "mnli", "validation_mismatched")]
    assert GLUE_TASKS["MNLI"].labels[s.labels[0]] == "contradiction" and s.ids == ["7"]
    assert s.source == "hf://datasets/nyu-mll/glue/mnli/validation_mismatched"


def test_hub_offline_fails_fast(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.monotonic()
    with pytest.raises(DataError, match=r"unreachable \(HF_HUB_OFFLINE=1 is set\)") as err:
        read_hub_split(GLUE_TASKS["MNLI"], "dev_matched")
    assert time.monotonic() - start < 1.0
    assert "glue_dir=/path/to/glue_data" in str(err.value) and "GLUE_DIR" in str(err.value)


def test_hub_unreachable_host_fails_fast(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")   # discard port: nothing listens
    start = time.monotonic()
    with pytest.raises(DataError, match=r"unreachable \(cannot connect to 127\.0\.0\.1:9"):
        read_hub_split(GLUE_TASKS["RTE"], "train")
    assert time.monotonic() - start < 4.0


# --------------------------------------------------------------------------- users' CSV files

def test_csv_regression_from_real_stsb_pairs(glue_dir, tmp_path):
    dev = read_glue_split(GLUE_TASKS["STS-B"], "dev", glue_dir)
    frame = pd.DataFrame({"left": dev.text_a, "right": dev.text_b,
                          "similarity": [f"{y:.3f}" for y in dev.labels],
                          "fold": [i % 5 for i in range(len(dev))]})
    path = tmp_path / "stsb.csv"
    frame.to_csv(path, index=False)
    s, labels = read_csv_split(path, ("left", "right"), "similarity", regression=True,
                               fold_column="fold")
    assert labels is None and len(s) == 1500
    assert s.text_a == dev.text_a and s.text_b == dev.text_b
    assert s.labels.dtype == np.float32 and np.allclose(s.labels, dev.labels, atol=5e-4)
    assert s.folds.dtype == np.int64 and s.folds[:6].tolist() == [0, 1, 2, 3, 4, 0]
    assert s.ids[:2] == ["0", "1"] and s.source == str(path)


def write_csv(tmp_path, rows, name="data.csv"):
    path = tmp_path / name
    with path.open("w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows(rows)
    return path


def test_csv_classification(tmp_path):
    path = write_csv(tmp_path, [["text", "label"], ["great, really", "pos"], ["NA", "neg"],
                                ["", " pos"], ["null", "neutral"]])
    s, labels = read_csv_split(path, ("text",), "label", regression=False)
    assert labels == ("neg", "neutral", "pos")
    assert s.labels.tolist() == [2, 0, 2, 1]
    assert s.text_a == ["great, really", "NA", "", "null"] and s.text_b is None and s.folds is None
    s, labels = read_csv_split(path, ("text",), "label", regression=False,
                               labels=("pos", "neg", "neutral"))
    assert labels == ("pos", "neg", "neutral") and s.labels.tolist() == [0, 1, 0, 2]


def test_csv_unknown_given_label_names_line(tmp_path):
    path = write_csv(tmp_path, [["text", "label"], ["two\nlines", "pos"], ["b", "meh"]])
    with pytest.raises(DataError, match=rf"{path}: line 4: unknown label 'meh'.*'pos', 'neg'"):
        read_csv_split(path, ("text",), "label", regression=False, labels=("pos", "neg"))


@pytest.mark.parametrize("value,problem", [
    ("abc", "'abc' in column 'y' is not a number"), ("nan", "target nan"),
    ("inf", "target inf"), ("", "empty target")])
def test_csv_bad_regression_target_names_line(tmp_path, value, problem):
    path = write_csv(tmp_path, [["x", "y"], ["a", "1.5"], ["b", "2"], ["c", value]])
    with pytest.raises(DataError, match=rf"{path}: line 4: {problem}"):
        read_csv_split(path, ("x",), "y", regression=True)


def test_csv_missing_columns_lists_file_columns(tmp_path):
    path = write_csv(tmp_path, [["sentence", "score"], ["a", "1"]])
    expected = r"no column 'text', 'fold'; the file has columns \['sentence', 'score'\]"
    with pytest.raises(DataError, match=expected):
        read_csv_split(path, ("text",), "score", regression=True, fold_column="fold")


def test_csv_bad_fold_names_line(tmp_path):
    path = write_csv(tmp_path, [["x", "y", "fold"], ["a", "1", "0"], ["b", "2", "1.5"]])
    with pytest.raises(DataError, match=rf"{path}: line 3: fold '1.5'"):
        read_csv_split(path, ("x",), "y", regression=True, fold_column="fold")


def test_csv_empty_and_unreadable_files(tmp_path):
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(DataError, match=rf"{empty}: the file is empty"):
        read_csv_split(empty, ("x",), "y", regression=True)
    header_only = write_csv(tmp_path, [["x", "y"]], name="header.csv")
    with pytest.raises(DataError, match="header but no rows"):
        read_csv_split(header_only, ("x",), "y", regression=True)
    latin1 = tmp_path / "latin1.csv"
    latin1.write_bytes(b"x,y\ncaf\xe9,1\n")
    with pytest.raises(DataError, match=rf"{latin1}: line 2: bytes are not valid UTF-8"):
        read_csv_split(latin1, ("x",), "y", regression=True)
    missing = tmp_path / "missing.csv"
    with pytest.raises(DataError, match=rf"{missing}: file not found"):
        read_csv_split(missing, ("x",), "y", regression=True)


def test_csv_regression_targets_are_finite(tmp_path):
    path = write_csv(tmp_path, [["x", "y"], ["a", " -2.5 "], ["b", "1e3"]])
    s, _ = read_csv_split(path, ("x",), "y", regression=True)
    assert s.labels.tolist() == [-2.5, 1000.0] and all(map(math.isfinite, s.labels))


def test_csv_fold_column_accepts_whole_floats(tmp_path):
    path = write_csv(tmp_path, [["x", "y", "fold"], ["a", "1", "2.0"], ["b", "0", " 3"]])
    s, labels = read_csv_split(path, ("x",), "y", regression=False, fold_column="fold")
    assert labels == ("0", "1") and s.folds.tolist() == [2, 3]
