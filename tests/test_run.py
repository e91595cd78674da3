"""kit.run: one point from the command line, through the batch's notebook and outputs contract."""
import dataclasses
import json

import pytest

from kit import run as krun
from kit.config.run_config import ConfigError, RunConfig
from kit.config.rules import CHOICES
from kit.train.finetune import run_dir_of


def test_values_take_the_type_of_their_field():
    params, options = krun.parse_args([
        "task=rte", "--method", "ssa-h", "--seed=2", "lr=1e-4", "epochs=3", "alpha=1",
        "mixed_precision=no", "tasks=RTE, CoLA", "--csv-text-columns", "[a, b]",
        "predict_test=true", "--share_weight", "false", "--save-labels", "--notebook", "finetune"])
    assert params == {"task": "rte", "method": "ssa-h", "seed": 2, "lr": 1e-4, "epochs": 3,
                      "alpha": 1, "mixed_precision": "no", "tasks": ["RTE", "CoLA"],
                      "csv_text_columns": ["a", "b"], "predict_test": True,
                      "share_weight": False, "save_labels": True}
    assert options == {"notebook": "finetune"}
    assert type(params["lr"]) is float                     # YAML 1.1 alone reads 1e-4 as text


def test_a_flag_before_a_name_value_is_true():
    params, _ = krun.parse_args(["--predict_test", "task=RTE", "--save_labels"])
    assert params == {"predict_test": True, "task": "RTE", "save_labels": True}


@pytest.mark.parametrize("argv, needle", [
    (["RTE"], "argument 'RTE': expected name=value"),
    (["seed=1", "--seed", "2"], "'seed' is given twice"),
    (["lr=[1"], "parameter 'lr': '[1' is not a YAML value")])
def test_bad_arguments_are_one_line(argv, needle):
    with pytest.raises(ConfigError, match=needle.replace("[", r"\[")) as info:
        krun.parse_args(argv)
    assert "\n" not in str(info.value)


def test_unknown_names_reach_configs_did_you_mean(capsys):
    assert krun.main(["learning_rate=1e-4"]) == 2
    assert capsys.readouterr().err.strip() == \
        "error: unknown parameter 'learning_rate' (did you mean 'lr'?)"


def test_help_lists_every_field_with_default_and_choices(capsys):
    assert krun.main(["--help"]) == 0
    text = capsys.readouterr().out
    for f in dataclasses.fields(RunConfig):
        default = list(f.default) if isinstance(f.default, tuple) else f.default
        assert f"  {f.name} = {json.dumps(default)}" in text, f.name
    for name, choices in CHOICES.items():
        assert f"{name} = " in text and f"one of: {', '.join(choices)}" in text
    assert "# masked variants per kept sentence per epoch" in text     # gamma's comment


def test_notebook_follows_the_method_and_folds():
    assert krun.notebook_for(RunConfig(), None).name == "finetune.ipynb"
    mix = RunConfig(task="multitask", method="gated", tasks=("RTE", "CoLA"))
    assert krun.notebook_for(mix, None).name == "multitask.ipynb"
    folds = RunConfig(task="csv", csv_path="x.csv", csv_text_columns=("t",), csv_target="y",
                      n_folds=5)
    assert krun.notebook_for(folds, None).name == "kaggle_csv.ipynb"
    with pytest.raises(ConfigError, match="--notebook 'nope': not in notebooks/"):
        krun.notebook_for(RunConfig(), "nope")


def test_one_point_runs_through_the_notebook_then_is_skipped(tmp_path, capsys):
    """The papermill path a user takes: metrics, the executed notebook and the run id of the
    same point in a profile; the second time it is skipped."""
    argv = ["task=synthetic", "method=bert", "model=tiny", "synthetic_size=64", "epochs=1",
            "batch_size=16", "lr=1e-3", f"outputs_dir={tmp_path}"]
    assert krun.main(argv) == 0
    cfg = RunConfig(task="synthetic", method="bert", model="tiny", synthetic_size=64, epochs=1,
                    batch_size=16, lr=1e-3, outputs_dir=str(tmp_path))
    run = run_dir_of(cfg)
    assert json.loads((run / "metrics.json").read_text())["status"] == "ok"
    assert (run / "notebook.ipynb").exists()
    first = capsys.readouterr().out
    assert f"{cfg.run_id}: ok" in first and "best epoch 0" in first
    assert krun.main(argv) == 0
    assert f"{cfg.run_id}: skipped (finished earlier)" in capsys.readouterr().out


def test_missing_data_is_reported_before_any_kernel(tmp_path, capsys):
    argv = ["task=csv", f"csv_path={tmp_path / 'none.csv'}", "csv_text_columns=text",
            "csv_target=y", f"outputs_dir={tmp_path}"]
    assert krun.main(argv) == 2
    assert "none.csv: file not found" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


# ---------------------------------------------------------------- the finetune notebook

FINETUNE = krun.REPO / "notebooks" / "finetune.ipynb"
SMOKE = {"model", "method", "lr", "synthetic_size"}   # the notebook's own defaults


def notebook_parameters(path) -> dict:
    """The parameters cell's assignments, as papermill would see them (plain literals)."""
    import ast

    import nbformat
    nb = nbformat.read(path, as_version=4)
    tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1
    tree = ast.parse(tagged[0].source)
    assert all(isinstance(node, ast.Assign) for node in tree.body)      # nothing but literals
    names = [node.targets[0].id for node in tree.body]
    assert len(names) == len(set(names))
    return {node.targets[0].id: ast.literal_eval(node.value) for node in tree.body}


def test_finetune_parameters_cell_lists_every_field_with_its_default():
    """So papermill warns about nothing the kit or a user passes, and the cell documents every
    knob; only the smoke knobs differ from RunConfig's defaults."""
    import nbformat
    params = notebook_parameters(FINETUNE)
    fields = {f.name: f.default for f in dataclasses.fields(RunConfig)}
    assert sorted(params) == sorted(fields)
    differ = {k for k, v in params.items()
              if (tuple(v) if isinstance(v, list) else v) != fields[k]}
    assert differ == SMOKE
    nb = nbformat.read(FINETUNE, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code)
    assert not any(line.lstrip().startswith(("def ", "class ")) for c in code
                   for line in c.source.splitlines())


def test_finetune_defaults_give_an_ssa_run_that_labels_tokens(tmp_path):
    """The notebook as shipped: SSA-H probes, some masked variants flip, tokens get label 1,
    and the synthetic task's cue words get label 1 more often than the distractors."""
    from kit.train.finetune import fit
    params = {**notebook_parameters(FINETUNE), "outputs_dir": str(tmp_path),
              "save_checkpoints": False}
    metrics = fit(RunConfig.from_namespace(params))
    assert metrics["status"] == "ok"
    stats = metrics["ssa_labels"]
    assert [s["epoch"] for s in stats] == [1, 2]                 # epochs after ssa_start_epoch
    assert all(s["flipped"] > 0 and s["labelled_tokens"] > 0 and s["share_label1"] > 0
               for s in stats)
    last = stats[-1]
    assert last["cue_share_label1"] > last["distractor_share_label1"]


def test_an_uncached_hub_model_offline_is_one_line_before_any_kernel(tmp_path, monkeypatch,
                                                                      capsys):
    import huggingface_hub.constants
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(krun.batch, "prepare_kernels", lambda: pytest.fail("a kernel started"))
    assert krun.main(["task=synthetic", "model=bert-base-uncased",
                      f"outputs_dir={tmp_path / 'out'}"]) == 2
    assert capsys.readouterr().err == (
        "error: model 'bert-base-uncased': the hub is unreachable (HF_HUB_OFFLINE=1 is set) and "
        "the model is not in the local cache; use a local Hugging Face folder, a classic "
        "bert_config.json folder or the embedded `minilm`\n")


def test_a_cached_hub_model_passes_the_offline_check(tmp_path, monkeypatch):
    import huggingface_hub.constants
    from kit.models.backbones import check_hub_model
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    repo = tmp_path / "models--org--encoder"            # the hub cache's layout
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc123")
    (repo / "snapshots" / "abc123").mkdir(parents=True)
    (repo / "snapshots" / "abc123" / "config.json").write_text("{}")
    check_hub_model("org/encoder")                      # cached: no error
    check_hub_model("minilm")                           # not a hub id: never checked
