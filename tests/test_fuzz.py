"""Property-based fuzzing of what users hand the kit: GLUE TSV files, CSV files and profiles.

Generated malformed inputs must either load or stop with ONE line (DataError / ConfigError)
that names the file; never another exception, never a multi-line message. Seeded
(derandomize), 100 cases per property: 400 cases per run of the suite.
"""
import string
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kit.config import profiles
from kit.config.run_config import ConfigError
from kit.data.csv_reader import read_csv_split
from kit.data.readers import DataError, read_glue_split
from kit.config.tasks import get_task

FUZZ = settings(max_examples=100, derandomize=True, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])

# cells: plain words, numbers, labels, and the characters that break naive readers
cell = st.one_of(
    st.sampled_from(["0", "1", "2.5", "5.1", "-1", "nan", "inf", "entailment", "not_entailment",
                     "", " ", "NA", "null", '"', '""', "a,b", "\ufeff", "x\ty", "1e400"]),
    st.text(alphabet=string.ascii_letters + string.digits + " .,'\"-\t\r\x0b\u2028\u00e9",
            max_size=12))
row = st.lists(cell, min_size=0, max_size=5)
line_end = st.sampled_from(["\n", "\r\n", ""])


def table(rows, sep: str, ends) -> str:
    return "".join(sep.join(r) + e for r, e in zip(rows, ends))


def one_line_error(err: Exception, path: Path) -> None:
    message = str(err)
    assert "\n" not in message and str(path) in message, message


GLUE_COLUMNS = {"RTE": ["index", "sentence1", "sentence2", "label"],
                "SST-2": ["sentence", "label"], "STS-B": ["index", "sentence1", "sentence2", "score"],
                "CoLA": [], "WNLI": ["index", "sentence1", "sentence2", "label"]}


@FUZZ
@given(task=st.sampled_from(sorted(GLUE_COLUMNS)), header=st.booleans(), data=st.data(),
       ends=st.lists(line_end, max_size=7),
       raw=st.one_of(st.none(), st.none(), st.none(), st.binary(max_size=40)))
def test_glue_tsv_reader_loads_or_names_the_file(tmp_path_factory, task, header, data, ends,
                                                 raw):
    root = tmp_path_factory.mktemp("glue")
    path = root / task / "dev.tsv"
    path.parent.mkdir()
    columns = GLUE_COLUMNS[task]
    width = len(columns) or 4                     # CoLA dev: 4 columns, no header
    words = st.text(alphabet=string.ascii_letters + " .'\"", max_size=10)
    label = st.sampled_from(["0", "1", "2.5", "entailment", "not_entailment", "9", ""])
    well_formed = st.tuples(st.lists(words, min_size=width - 1, max_size=width - 1), label).map(
        lambda t: [*t[0], t[1]] if task != "CoLA" else [t[0][0], t[1], t[0][1], t[0][2]])
    rows = data.draw(st.lists(st.one_of(row, well_formed, well_formed), max_size=6))
    text = table(([columns] if header and columns else []) + rows, "\t",
                 ["\n"] * header + ends + ["\n"] * len(rows))
    path.write_bytes(raw if raw is not None else text.encode())
    try:
        split = read_glue_split(get_task(task), "dev", root)
    except DataError as err:
        one_line_error(err, path)
    else:
        assert len(split.text_a) == len(split.labels) == len(split.ids)


@FUZZ
@given(rows=st.lists(row, max_size=6), ends=st.lists(line_end, max_size=7),
       regression=st.booleans(), header=st.sampled_from([["text", "target"], ["text"],
                                                         ["id", "text", "target"], []]))
def test_csv_reader_loads_or_names_the_file(tmp_path_factory, rows, ends, regression, header):
    path = tmp_path_factory.mktemp("csv") / "data.csv"
    path.write_text(table([header] + rows, ",", ["\n"] + ends + ["\n"] * len(rows)))
    try:
        split, labels = read_csv_split(path, ("text",), "target", regression)
    except DataError as err:
        one_line_error(err, path)
    else:
        assert len(split.text_a) == len(split.labels) == len(split.ids)
        assert (labels is None) == regression


yaml_value = st.one_of(st.integers(-3, 10**6), st.floats(allow_nan=True), st.booleans(),
                       st.none(), st.text(max_size=8),
                       st.sampled_from(["RTE", "sst2", "ssa-h", "1e-5", "[1, 2", "{a: 1}"]))
yaml_key = st.sampled_from(["task", "method", "seed", "lr", "epochs", "gamma", "model", "grid",
                            "notebook", "tasks", "batch_size", "lrr", "task_overrides", "figures"])


@FUZZ
@given(top=st.dictionaries(st.sampled_from(["grid", "notebook", "description", "task", "gird",
                                            "skip_missing_tasks", "task_overrides", "figures"]),
                           st.one_of(yaml_value, st.dictionaries(yaml_key, yaml_value, max_size=4),
                                     st.lists(yaml_value, max_size=3)), max_size=4),
       garbage=st.one_of(st.none(), st.text(alphabet=":[]{}-#'\"\t\n ab1", max_size=20)))
def test_profile_loader_loads_or_names_the_file(tmp_path_factory, top, garbage):
    import yaml
    path = tmp_path_factory.mktemp("profile") / "p.yaml"
    path.write_text(garbage if garbage is not None else yaml.safe_dump(top))
    try:
        profile = profiles.load_profile(str(path), str(path.parent / "out"))
    except ConfigError as err:
        one_line_error(err, path)
    else:
        assert profile.points


@FUZZ
@given(rows=st.lists(st.lists(st.sampled_from(["a", "b", "0", "1", "", "2.5"]), min_size=3,
                              max_size=3), min_size=1, max_size=8),
       folds=st.sampled_from([None, "fold"]))
def test_csv_fold_column_loads_or_names_the_file(tmp_path_factory, rows, folds):
    path = tmp_path_factory.mktemp("csv") / "folds.csv"
    path.write_text(table([["text", "target", "fold"]] + rows, ",", ["\n"] * (len(rows) + 1)))
    try:
        read_csv_split(path, ("text",), "target", False, folds)
    except DataError as err:
        one_line_error(err, path)
