"""Tests of kit.config.run_config: validation of every knob, type coercion and the stable run id."""
import dataclasses

import numpy as np
import pytest

from kit.config.run_config import METHODS, ConfigError, RunConfig


def test_defaults_are_valid():
    cfg = RunConfig()
    assert cfg == RunConfig.from_dict({})
    assert cfg.method in METHODS
    assert not cfg.uses_ssa
    assert RunConfig(method="ssa-co").uses_ssa and RunConfig(method="ssa-h").uses_ssa
    assert not RunConfig(method="bert-mask").uses_ssa
    # every float field really holds a float
    for f in dataclasses.fields(RunConfig):
        if f.type in ("float", float):
            assert type(getattr(cfg, f.name)) is float, f.name


def test_to_dict_round_trips():
    cfg = RunConfig.from_dict({"task": "RTE", "method": "ssa-h", "beta": 0.25,
                               "csv_text_columns": ["a"]})
    assert RunConfig.from_dict(cfg.to_dict()) == cfg


# --------------------------------------------------------------------------- unknown names

@pytest.mark.parametrize("typo, meant", [("learning_rat", None), ("lr_", "lr"), ("alpah", "alpha"),
                                         ("mask_ration", "mask_ratio"), ("epoch", "epochs")])
def test_unknown_parameter_gives_did_you_mean(typo, meant):
    with pytest.raises(ConfigError) as info:
        RunConfig.from_dict({typo: 1})
    msg = str(info.value)
    assert repr(typo) in msg and "unknown parameter" in msg
    if meant is not None:
        assert f"did you mean {meant!r}" in msg
    assert "\n" not in msg


def test_unknown_parameter_without_close_match_has_no_hint():
    with pytest.raises(ConfigError) as info:
        RunConfig.from_dict({"zzzzqqqq": 1})
    assert "did you mean" not in str(info.value)


# --------------------------------------------------------------------------- types

def test_string_float_names_parameter_and_yaml_hint():
    with pytest.raises(ConfigError) as info:
        RunConfig.from_dict({"lr": "1e-5"})
    msg = str(info.value)
    assert "'lr'" in msg and "float" in msg and "'1e-5'" in msg
    assert "YAML" in msg and "1.0e-5" in msg
    assert "\n" not in msg


@pytest.mark.parametrize("name", ["epochs", "batch_size", "seed", "max_length", "grad_accum"])
def test_bool_is_not_an_int(name):
    with pytest.raises(ConfigError, match=repr(name)):
        RunConfig.from_dict({name: True})


@pytest.mark.parametrize("name", ["lr", "alpha", "beta", "gamma"])
def test_bool_is_not_a_float(name):
    with pytest.raises(ConfigError, match=repr(name)):
        RunConfig.from_dict({name: False})


@pytest.mark.parametrize("name, value", [("epochs", 2.0), ("batch_size", "32"), ("seed", 1.5),
                                         ("task", 3), ("share_weight", 1),
                                         ("csv_text_columns", [1, 2])])
def test_wrong_types_rejected(name, value):
    with pytest.raises(ConfigError, match=repr(name)) as info:
        RunConfig.from_dict({name: value})
    assert "YAML" not in str(info.value)   # the YAML hint is only for strings given for floats


@pytest.mark.parametrize("name, value", [("lr", 1), ("alpha", 1), ("beta", 0), ("gamma", 2),
                                         ("weight_decay", 0), ("max_grad_norm", 5)])
def test_ints_accepted_for_floats_and_stored_as_float(name, value):
    cfg = RunConfig.from_dict({name: value})
    got = getattr(cfg, name)
    assert type(got) is float and got == value


def test_lists_become_tuples_for_csv_text_columns():
    cfg = RunConfig.from_dict({"task": "csv", "csv_path": "x.csv", "csv_text_columns": ["a", "b"],
                               "csv_target": "y"})
    assert cfg.csv_text_columns == ("a", "b")
    assert isinstance(cfg.csv_text_columns, tuple)
    hash(cfg)   # frozen and hashable only if no list slipped through


# --------------------------------------------------------------------------- ranges and choices

@pytest.mark.parametrize("name, value", [
    ("gamma", -0.1), ("gamma", float("inf")), ("alpha", -0.01), ("alpha", 1.01), ("beta", -1.0),
    ("beta", 1.5), ("mask_ratio", 0), ("mask_ratio", 0.0), ("mask_ratio", 1.0001),
    ("epochs", 0), ("epochs", -3), ("lr", 0.0), ("lr", -1e-5), ("lr", float("nan")),
    ("alpha", float("nan")), ("batch_size", 0), ("grad_accum", 0), ("warmup_ratio", 1.0),
    ("max_length", 4), ("max_length", 5000), ("layer_decay", 0.0), ("aug_threshold", 0.0),
    ("synthetic_size", 7), ("max_train_examples", -1), ("attention_threshold", 1.5),
])
def test_out_of_range_rejected(name, value):
    with pytest.raises(ConfigError, match=repr(name)) as info:
        RunConfig.from_dict({name: value})
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("name, value", [
    ("gamma", 0), ("gamma", 3.5), ("alpha", 0), ("alpha", 1), ("beta", 0.0), ("beta", 1.0),
    ("mask_ratio", 1.0), ("mask_ratio", 1e-3), ("epochs", 1), ("max_length", 8),
    ("max_length", 4096), ("layer_decay", 1.0), ("warmup_ratio", 0.0),
])
def test_boundaries_accepted(name, value):
    assert getattr(RunConfig.from_dict({name: value}), name) == value


def test_range_property_over_random_values():
    rng = np.random.default_rng(0)
    for value in rng.uniform(-2, 3, size=60):
        value = float(value)
        for name in ("alpha", "beta"):
            if 0 <= value <= 1:
                assert getattr(RunConfig.from_dict({name: value}), name) == value
            else:
                with pytest.raises(ConfigError):
                    RunConfig.from_dict({name: value})
        if 0 < value <= 1:
            RunConfig.from_dict({"mask_ratio": value})
        else:
            with pytest.raises(ConfigError):
                RunConfig.from_dict({"mask_ratio": value})
        if value >= 0:
            RunConfig.from_dict({"gamma": value})
        else:
            with pytest.raises(ConfigError):
                RunConfig.from_dict({"gamma": value})


@pytest.mark.parametrize("name, good, bad", [
    ("method", ["bert", "bert-mask", "ssa-co", "ssa-h"], ["ssa", "BERT", "ssa_h", ""]),
    ("label_rule", ["paper", "code"], ["Paper", "released"]),
    ("mask_scheme", ["ratio", "spans"], ["span", "random"]),
    ("hybrid_weighting", ["paper", "code"], ["softmax", ""]),
    ("label_merge", ["union", "variant"], ["variants", "both"]),
    ("guide_loss", ["task", "task+pd", "task+ad", "task+both"], ["pd", "task+pd+ad"]),
    ("guide_reduction", ["query", "key"], ["value"]),
    ("mixed_precision", ["auto", "no", "bf16", "fp16"], ["fp32", "yes"]),
])
def test_choices(name, good, bad):
    for value in good:
        assert getattr(RunConfig.from_dict({name: value}), name) == value
    for value in bad:
        with pytest.raises(ConfigError) as info:
            RunConfig.from_dict({name: value})
        msg = str(info.value)
        assert repr(name) in msg and repr(value) in msg
        assert all(choice in msg for choice in good)   # the message lists the allowed values


@pytest.mark.parametrize("missing", ["csv_path", "csv_text_columns", "csv_target"])
def test_csv_task_needs_path_columns_and_target(missing):
    params = {"task": "csv", "csv_path": "data.csv", "csv_text_columns": ["text"],
              "csv_target": "y"}
    RunConfig.from_dict(params)           # complete: fine
    params.pop(missing)
    with pytest.raises(ConfigError, match="csv"):
        RunConfig.from_dict(params)
    with pytest.raises(ConfigError, match="csv_path"):
        RunConfig.from_dict({**params, "task": "CSV", missing: "" if missing != "csv_text_columns"
                             else []})


def test_empty_task_and_model_rejected():
    with pytest.raises(ConfigError, match="task"):
        RunConfig.from_dict({"task": ""})
    with pytest.raises(ConfigError, match="model"):
        RunConfig.from_dict({"model": ""})


# --------------------------------------------------------------------------- run id

def test_run_id_is_stable_and_readable():
    a = RunConfig.from_dict({"task": "SST-2", "method": "ssa-h", "seed": 3, "lr": 3e-5})
    b = RunConfig.from_dict({"seed": 3, "lr": 3e-5, "method": "ssa-h", "task": "SST-2"})
    assert a.run_id == b.run_id == a.run_id
    assert a.run_id.startswith("SST-2-ssa-h-s3-")


def test_run_id_known_value():
    """A hash of the identity fields must not drift between processes or versions silently."""
    import hashlib
    import json
    from kit.config.run_config import RESULTS_VERSION
    cfg = RunConfig(lr=1e-4, outputs_dir="elsewhere")
    identity = {"version": RESULTS_VERSION, "lr": 1e-4}   # only non-default identity fields
    digest = hashlib.sha1(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:10]
    assert cfg.run_id == f"synthetic-bert-s0-{digest}"


@pytest.mark.parametrize("change", [{"lr": 3e-5}, {"alpha": 0.5}, {"beta": 0.4}, {"seed": 1},
                                    {"model": "tiny"}, {"max_length": 64}, {"gamma": 2},
                                    {"method": "ssa-co"}, {"epochs": 4}, {"label_rule": "code"},
                                    {"max_train_examples": 100}, {"share_weight": False}])
def test_run_id_changes_with_identity_fields(change):
    assert RunConfig.from_dict(change).run_id != RunConfig().run_id


@pytest.mark.parametrize("change", [{"outputs_dir": "/elsewhere"}, {"profile": "smoke"},
                                    {"glue_dir": "/data/glue"}, {"log_every": 99},
                                    {"save_checkpoints": False}, {"eval_batch_size": 7}])
def test_run_id_ignores_non_identity_fields(change):
    assert RunConfig.from_dict(change).run_id == RunConfig().run_id


def test_int_and_float_give_the_same_run_id():
    assert RunConfig.from_dict({"gamma": 2}).run_id == RunConfig.from_dict({"gamma": 2.0}).run_id


def test_from_namespace_ignores_junk():
    namespace = {"task": "RTE", "lr": 1e-5, "method": "ssa-co", "np": np, "__name__": "__main__",
                 "In": [], "_": None, "helper": lambda x: x, "result": {"a": 1}}
    cfg = RunConfig.from_namespace(namespace)
    assert (cfg.task, cfg.lr, cfg.method) == ("RTE", 1e-5, "ssa-co")
    assert cfg.epochs == RunConfig().epochs
    # but a bad value among the picked fields still fails
    with pytest.raises(ConfigError, match="'lr'"):
        RunConfig.from_namespace({**namespace, "lr": "1e-5"})


def test_unknown_task_is_a_config_error_naming_the_choices():
    with pytest.raises(ConfigError, match="parameter 'task': unknown task 'RTEE': choose one of .*RTE"):
        RunConfig(task="RTEE")


# --------------------------------------------------------------------------- forgiving, exact

@pytest.mark.parametrize("alias, field", [
    ("learning_rate", "lr"), ("num_train_epochs", "epochs"), ("num_epochs", "epochs"),
    ("per_device_train_batch_size", "batch_size"), ("train_batch_size", "batch_size"),
    ("model_name_or_path", "model"), ("task_name", "task"), ("max_seq_length", "max_length"),
    ("warmup", "warmup_ratio"), ("gradient_accumulation_steps", "grad_accum"),
    ("lr_decay_factor", "layer_decay")])
def test_other_tools_names_are_answered_with_the_kits_name(alias, field):
    """Aliases are rejected, consistently, with the one name the kit uses (difflib alone
    finds nothing for learning_rate)."""
    with pytest.raises(ConfigError) as info:
        RunConfig.from_dict({alias: 1})
    assert str(info.value) == f"unknown parameter {alias!r} (did you mean {field!r}?)"


def test_every_alias_points_at_a_field():
    from kit.config.run_config import PARAMETER_ALIASES
    names = {f.name for f in dataclasses.fields(RunConfig)}
    assert set(PARAMETER_ALIASES.values()) <= names
    assert not set(PARAMETER_ALIASES) & names


def test_an_alias_injected_into_a_notebook_is_not_dropped_silently():
    with pytest.raises(ConfigError, match="'learning_rate' \\(did you mean 'lr'\\?\\)"):
        RunConfig.from_namespace({"task": "RTE", "learning_rate": 1e-4})


@pytest.mark.parametrize("spelling, canonical", [
    ("sst2", "SST-2"), ("sst-2", "SST-2"), ("SST2", "SST-2"), ("Sst-2", "SST-2"),
    ("sst_2", "SST-2"), ("stsb", "STS-B"), ("STSB", "STS-B"), ("sts-b", "STS-B"),
    ("mnli", "MNLI"), ("cola", "CoLA"), ("rte", "RTE"), ("qnli", "QNLI"),
    ("Synthetic", "synthetic"), ("synthetic_pair", "synthetic-pair")])
def test_task_names_are_normalised_before_the_run_id(spelling, canonical):
    cfg = RunConfig.from_dict({"task": spelling})
    assert cfg.task == canonical
    assert cfg.run_id == RunConfig(task=canonical).run_id
    assert cfg.run_id.startswith(f"{canonical}-bert-s0-")


def test_csv_and_multitask_task_names_are_normalised():
    csv = {"csv_path": "x.csv", "csv_text_columns": "text", "csv_target": "y"}
    assert RunConfig.from_dict({**csv, "task": "CSV"}).run_id == \
        RunConfig.from_dict({**csv, "task": "csv"}).run_id
    mix = RunConfig.from_dict({"task": "MultiTask", "method": "embert", "tasks": ["rte", "sst2"]})
    assert (mix.task, mix.tasks) == ("multitask", ("RTE", "SST-2"))
    assert mix.run_id == RunConfig.from_dict({"task": "multitask", "method": "embert",
                                              "tasks": ["RTE", "SST-2"]}).run_id


def test_unknown_task_gets_a_did_you_mean():
    with pytest.raises(ConfigError, match="unknown task 'sst3'.*did you mean 'SST-2'"):
        RunConfig.from_dict({"task": "sst3"})
    with pytest.raises(ConfigError, match="'tasks': unknown task 'colaa'.*did you mean 'CoLA'"):
        RunConfig.from_dict({"task": "multitask", "method": "gated", "tasks": ["RTE", "colaa"]})


@pytest.mark.parametrize("params, field, want", [
    ({"task": "csv", "csv_path": "x.csv", "csv_text_columns": "text", "csv_target": "y"},
     "csv_text_columns", ("text",)),
    ({"task": "multitask", "method": "embert", "tasks": "RTE"}, "tasks", ("RTE",)),
    ({"task": "multitask", "method": "embert", "tasks": ("RTE", "CoLA")}, "tasks",
     ("RTE", "CoLA"))])
def test_a_bare_string_is_a_one_item_tuple(params, field, want):
    cfg = RunConfig.from_dict(params)
    assert getattr(cfg, field) == want
    hash(cfg)


@pytest.mark.parametrize("bad, needle", [
    ({"csv_metric": "rmse"}, "'csv_metric': for task 'csv'"),
    ({"csv_test_path": "t.csv"}, "'csv_test_path': for task 'csv'"),
    ({"task": "csv", "csv_metric": "accuracy"}, "not a regression metric; choose one of rmse"),
    ({"task": "csv", "csv_regression": False, "csv_metric": "rmse"},
     "not a classification metric; choose one of accuracy"),
    ({"task": "csv", "csv_test_path": "t.csv", "csv_id_column": ""}, "'csv_id_column' is empty")])
def test_csv_submission_knobs_are_validated(bad, needle):
    csv = {"csv_path": "x.csv", "csv_text_columns": "text", "csv_target": "y"}
    with pytest.raises(ConfigError, match=needle) as info:
        RunConfig.from_dict({**(csv if bad.get("task") == "csv" else {}), **bad})
    assert "\n" not in str(info.value)


def test_any_casing_and_separators_of_a_task_name_give_one_run_id():
    """Property: a GLUE or synthetic task name with its letters' case flipped and '-', '_' or
    ' ' inserted or removed anywhere normalises to the registry's name and its run id."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from kit.config.tasks import GLUE_TASKS, SYNTHETIC_TASKS
    names = [*GLUE_TASKS, *SYNTHETIC_TASKS]

    @settings(max_examples=200, deadline=None, derandomize=True)
    @given(st.sampled_from(names), st.data())
    def check(name, data):
        letters = [c for c in name if c not in "-_ "]
        seps = data.draw(st.lists(st.sampled_from(["", "-", "_", " "]), min_size=len(letters),
                                  max_size=len(letters)))
        upper = data.draw(st.lists(st.booleans(), min_size=len(letters), max_size=len(letters)))
        spelled = "".join((c.upper() if u else c.lower()) + s
                          for c, u, s in zip(letters, upper, seps)).strip(" ")
        cfg = RunConfig.from_dict({"task": spelled})
        assert cfg.task == name and cfg.run_id == RunConfig(task=name).run_id

    check()
