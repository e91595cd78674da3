"""kit.run: one point from the command line, through the batch's notebook and outputs contract."""
import dataclasses
import json
from pathlib import Path

import pytest

from kit import run as krun
from kit.config.profiles import Profile
from kit.config.run_config import ConfigError, RunConfig
from kit.config.rules import CHOICES
from kit.runs import run_dir_of
from run_folders import files, hidden


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
    assert f"{cfg.run_id}: ok" in first and "best epoch 1/1, " in first    # counted from 1
    assert krun.main(argv) == 0
    assert f"{cfg.run_id}: skipped (finished earlier)" in capsys.readouterr().out


def test_missing_data_is_reported_before_any_kernel(tmp_path, capsys):
    argv = ["task=csv", f"csv_path={tmp_path / 'none.csv'}", "csv_text_columns=text",
            "csv_target=y", f"outputs_dir={tmp_path}"]
    assert krun.main(argv) == 2
    assert "none.csv: file not found" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


# ---------------------------------------------------------------- the training notebooks

FINETUNE = krun.REPO / "notebooks" / "finetune.ipynb"
SMOKE = {"model", "method", "lr", "synthetic_size"}   # the notebook's own defaults
# each training notebook's parameters cell: the knobs a person changes first, and those whose
# value is deliberately not RunConfig's default (a small offline run, the CSV fixtures)
TRAINING = {"finetune": SMOKE,
            "kaggle_csv": {"task", "model", "csv_path", "csv_text_columns", "csv_target",
                           "csv_test_path", "n_folds", "epochs", "batch_size", "lr",
                           "layer_decay"},
            "pretrain": {"task", "model", "method", "max_train_examples", "epochs", "lr"}}


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


def notebook_only_names(nb) -> set[str]:
    """The names a notebook's `RunConfig.from_namespace(globals(), ignore=(...))` call leaves
    out of the config: its own parameters, documented there."""
    import ast
    found = set()
    for cell in (c for c in nb.cells if c.cell_type == "code"):
        for node in ast.walk(ast.parse(cell.source)):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "from_namespace":
                found |= {n for k in node.keywords if k.arg == "ignore"
                          for n in ast.literal_eval(k.value)}
    return found


@pytest.mark.parametrize("name", TRAINING)
def test_training_notebooks_show_the_first_knobs_each_with_a_comment(name, caplog):
    """A short cell (every other field keeps its default: `kit.run --help` lists them; papermill
    and profiles inject any): each name is a RunConfig field or one the notebook's
    from_namespace call ignores, with the field's default unless deliberately not; each line
    says what it does; papermill reads every name (a "=" in a comment would make it warn that
    it cannot parse the line)."""
    import nbformat
    from papermill.translators import PythonTranslator
    path = krun.REPO / "notebooks" / f"{name}.ipynb"
    nb = nbformat.read(path, as_version=4)
    params = notebook_parameters(path)
    fields = {f.name: f.default for f in dataclasses.fields(RunConfig)}
    assert set(params) <= set(fields) | notebook_only_names(nb)
    assert 10 <= len(params) <= 25
    differ = {k for k, v in params.items()
              if k in fields and (tuple(v) if isinstance(v, list) else v) != fields[k]}
    assert differ == TRAINING[name]
    cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    assert cell.source.startswith("# parameters")       # kit.config.notebook_cells finds it
    assignments = [line for line in cell.source.splitlines() if not line.startswith("#")]
    assert all("  # " in line for line in assignments)
    with caplog.at_level("WARNING", logger="papermill"):
        assert [p.name for p in PythonTranslator.inspect(cell)] == list(params)
    assert not caplog.records
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code)
    assert not any(line.lstrip().startswith(("def ", "class ")) for c in code
                   for line in c.source.splitlines())


def test_the_config_is_the_parameters_cell_and_papermills_not_later_variables(capsys):
    """IPython's input history (`In`) in a notebook's namespace: the latest `# parameters` cell,
    then papermill's `# Parameters` cell; a later `epochs = 7` (or a loop's `fold`) is left
    out, with one line naming it; a value that is no literal comes from the namespace."""
    history = ["", '# parameters\ntask = "RTE"\nlr = 1e-3\nwarmup_ratio = 0.05 * 2',
               "# Parameters\nlr = 0.01\n", "epochs = 7\nfor fold in range(3):\n    pass",
               "config = RunConfig.from_namespace(globals())"]
    namespace = {"In": history, "task": "RTE", "lr": 0.01, "warmup_ratio": 0.05 * 2,
                 "epochs": 7, "fold": 2, "np": dataclasses}
    cfg = RunConfig.from_namespace(namespace)
    assert (cfg.task, cfg.lr, cfg.warmup_ratio, cfg.epochs, cfg.fold) == ("RTE", 0.01, 0.1, 3, 0)
    assert capsys.readouterr().out == (
        "note: epochs, fold set outside the parameters cell: not used (the config is the "
        "parameters cell and papermill's parameters; change it there)\n")


def test_a_warm_kernels_earlier_points_do_not_leak_into_the_next():
    """kit.cluster.kernels' %reset clears the namespace but keeps the history: an earlier point's
    injected cell comes before the current parameters cell, so it is not read."""
    history = ["", '# parameters\ntask = "RTE"', "# Parameters\nseed = 5\nepochs = 1", "fit()",
               "get_ipython().run_line_magic('reset', '-f')", '# parameters\ntask = "CoLA"',
               "# Parameters\nepochs = 2", "fit()"]
    cfg = RunConfig.from_namespace({"In": history, "task": "CoLA", "epochs": 2})
    assert (cfg.task, cfg.seed, cfg.epochs) == ("CoLA", 0, 2)


def test_a_name_in_the_cells_that_is_no_field_is_one_line():
    history = ["", '# parameters\ntask = "RTE"\nshow_tokens = 5', "# Parameters\nepoch = 3"]
    with pytest.raises(ConfigError, match=r"^unknown parameter 'epoch' \(did you mean 'epochs'\?\)$"):
        RunConfig.from_namespace({"In": history}, ignore=("show_tokens",))
    history[-1] = "# Parameters\nlearning_rate = 1e-4"
    with pytest.raises(ConfigError, match="'learning_rate' \\(did you mean 'lr'\\?\\)"):
        RunConfig.from_namespace({"In": history}, ignore=("show_tokens",))
    history[-1] = "# Parameters\nlr = 1e-4"
    assert RunConfig.from_namespace({"In": history}, ignore=("show_tokens",)).lr == 1e-4
    with pytest.raises(ConfigError, match="unknown parameter 'show_tokens'"):
        RunConfig.from_namespace({"In": history})


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
    monkeypatch.setattr(krun, "prepare_kernels", lambda: pytest.fail("a kernel started"))
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


# ---------------------------------------------------------------- one rerun protocol (kit.runs)

TINY = dict(task="synthetic", model="tiny", synthetic_size=16, epochs=1, lr=5e-3, batch_size=16,
            save_checkpoints=False, report_to=["none"])


class InProcessKernel:
    """A notebook kernel stand-in: what the notebook's cells run, fit(its parameters), in this
    process; its errors are the notebook's."""

    def __init__(self, fresh: bool = True):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def start(self):
        pass

    def signal(self, name):
        pass

    def execute(self, notebook, output, parameters, stderr_file):
        from kit.train.finetune import fit
        fit(RunConfig.from_dict(parameters))


class DyingKernel(InProcessKernel):
    def execute(self, notebook, output, parameters, stderr_file):
        raise RuntimeError("Kernel died")


def preempted(*args):
    from kit.runs import RunPreempted
    raise RunPreempted({"signal": "SIGTERM", "epoch": 1, "step": 0})


def nan_loss(*args):
    import torch
    return torch.tensor(float("nan"), requires_grad=True)


@pytest.fixture
def finished_run(tmp_path, monkeypatch, capsys):
    """A finished tiny run made by kit.run: (argv of that point, its config, its files). The
    notebook runs in this process (InProcessKernel) here and in the test that uses it."""
    from kit.cluster import point
    monkeypatch.setattr(krun, "prepare_kernels", lambda: None)
    monkeypatch.setattr(point, "Kernels", InProcessKernel)
    argv = [f"{k}={v}" for k, v in TINY.items() if k != "report_to"] + [
        "report_to=none", f"outputs_dir={tmp_path}"]
    assert krun.main(argv) == 0
    cfg = RunConfig.from_dict({**TINY, "outputs_dir": str(tmp_path)})
    capsys.readouterr()
    return argv, cfg, files(run_dir_of(cfg))


@pytest.fixture
def stopped_rerun(finished_run, monkeypatch, capsys):
    """The finished run, set aside by `kit.run --rerun`, whose rerun a signal stopped: what
    finished_run gives, and what the rerun printed."""
    from kit.train import loop
    argv, cfg, before = finished_run
    with monkeypatch.context() as m:
        m.setattr(loop, "run", preempted)
        assert krun.main([*argv, "--rerun"]) == 75
    assert hidden(cfg) == [f".{cfg.run_id}.previous"]
    return argv, cfg, before, capsys.readouterr().out


def test_kit_run_reruns_through_the_notebook_keeping_the_old_run_until_ok(
        finished_run, monkeypatch, capsys):
    """A finished point is reused in one line; `--rerun` hands it, rerun=true, to the notebook,
    whose fit() sets the finished run aside and puts it back when the rerun fails (exit 1, the
    line says so), drops it once a rerun ends ok."""
    import kit.train.finetune as finetune
    argv, cfg, before = finished_run
    assert krun.main(argv) == 0                        # finished: reused, one line says so
    out = capsys.readouterr().out
    assert f"{cfg.run_id}: skipped (finished earlier)" in out and "best epoch 1/1, " in out
    assert f"reused finished run {cfg.run_id} (trained " in out and "rerun=true trains" in out
    with monkeypatch.context() as m:
        m.setattr(finetune, "target_loss", nan_loss)
        assert krun.main([*argv, "--rerun"]) == 1
    assert (f"{cfg.run_id}: failed (NonFiniteLoss: non-finite loss at epoch 0 step 1: loss=nan; "
            "the finished run is kept (its rerun did not finish))") in capsys.readouterr().out
    assert files(run_dir_of(cfg)) == before and hidden(cfg) == []
    assert krun.main([*argv, "rerun=true"]) == 0
    again = files(run_dir_of(cfg))
    assert hidden(cfg) == [] and again["metrics.json"] != before["metrics.json"]
    assert json.loads(again["metrics.json"])["status"] == "ok"


def test_a_stopped_rerun_says_where_the_finished_run_waits(stopped_rerun):
    argv, cfg, before, out = stopped_rerun
    aside = run_dir_of(cfg).parent / f".{cfg.run_id}.previous"
    assert (f"{cfg.run_id}: preempted (stopped by SIGTERM at epoch 1, step 0; rerun to resume; "
            f"the finished run waits in {aside} until this rerun finishes (it comes back if the "
            "rerun fails))") in out


@pytest.mark.parametrize("path", ["fit", "batch", "kit.run"])
def test_a_set_aside_run_comes_back_when_its_replacement_fails_on_every_path(
        stopped_rerun, monkeypatch, capsys, path):
    """The stopped rerun resumed without rerun=true (a batch, a plain run, fit() itself) fails:
    the finished run comes back, byte for byte, and the failure's line says so."""
    import kit.train.finetune as finetune
    from kit.train.window import NonFiniteLoss
    argv, cfg, before, _ = stopped_rerun
    monkeypatch.setattr(finetune, "target_loss", nan_loss)
    if path == "fit":
        with pytest.raises(NonFiniteLoss):
            finetune.fit(cfg)
    elif path == "batch":
        profile = Profile("p", Path("p.yaml"), None, [cfg.to_dict()], False)
        status, detail = krun.execute(profile, cfg.to_dict(), kernels=DyingKernel())
        assert (status, detail) == ("failed", "RuntimeError: Kernel died; the finished run is "
                                              "kept (its rerun did not finish)")
    else:
        assert krun.main(argv) == 1
        assert "; the finished run is kept (its rerun did not finish))" in capsys.readouterr().out
    assert files(run_dir_of(cfg)) == before and hidden(cfg) == []
