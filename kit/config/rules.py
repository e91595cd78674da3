"""What a valid RunConfig is, declared once: the choices and the ranges of its fields, checked by
one loop (`field_problem`), then the few rules that relate fields to each other. Every check returns
the one-line problem, naming the parameter, or None; kit.config.run_config raises the first one as
ConfigError, in the order of RULES. kit.run --help lists CHOICES."""
from __future__ import annotations

from kit import methods
from kit.config.tasks import get_task

REPORT_TO = ("auto", "none", "tensorboard", "wandb", "mlflow", "trackio")   # kit.train.tracking
# The fixed choices by field; every item of a tuple field (report_to) must be one.
CHOICES = {
    "report_to": REPORT_TO, "method": methods.names(), "mask_scheme": ("ratio", "spans"),
    "label_rule": ("paper", "code"), "label_merge": ("variant", "union"),
    "hybrid_weighting": ("paper", "code", "logodds"),
    "mixed_precision": ("auto", "no", "bf16", "fp16"),
    "dropout_rng": ("auto", "torch", "packed"),
    "length_buckets": ("auto", "off", "on"), "cuda_graphs": ("auto", "off", "on"),
    "guide_loss": ("task", "task+pd", "task+ad", "task+both"), "guide_reduction": ("query", "key"),
    "sampling": ("prop", "sqrt", "anneal", "round-robin"), "budget": ("epochs", "equal_steps"),
}
# What a `mixed_precision` value is called where a reader sees it (a report's header, a
# checkpoint's hardware line): autocast's "no" is fp32; the others are their own names.
PRECISION_NAMES = {"no": "fp32"}


def precision_name(value: str) -> str:
    return PRECISION_NAMES.get(value, value)


# The interval of each numeric field, as its error message prints it ("[" "]" closed, "(" ")"
# open).
RANGES = {
    "alpha": "[0, 1]", "beta": "[0, 1]", "mask_ratio": "(0, 1]", "gamma": "[0, inf)",
    "lr": "(0, inf)", "weight_decay": "[0, inf)", "warmup_ratio": "[0, 1)",
    "attention_threshold": "[0, 1]", "aug_threshold": "(0, 1]", "rm_threshold": "[0, 1]",
    "code_share_step": "[0, 1]", "code_share_max": "[0, 1]", "regression_tolerance": "[0, inf)",
    "max_grad_norm": "(0, inf)", "epochs": "[1, inf)", "batch_size": "[1, inf)",
    "eval_batch_size": "[1, inf)", "grad_accum": "[1, inf)", "max_length": "[8, 4096]",
    "max_train_examples": "[0, inf)", "synthetic_size": "[8, inf)", "ssa_start_epoch": "[0, inf)",
    "log_every": "[1, inf)", "layer_decay": "(0, 1]", "freeze_layers": "[0, inf)",
    "checkpoint_minutes": "[0, inf)", "checkpoint_steps": "[0, inf)",
    "pd_factor": "[0, inf)", "ad_factor": "[0, inf)", "synthetic_spurious": "[0, 1]",
    "synthetic_distractors": "[0, 64]", "steps_per_epoch": "[0, inf)", "adapter_rank": "[0, inf)",
    "gate_start_epoch": "[0, inf)", "freeze_qkv_epoch": "[0, inf)", "mlm_probability": "(0, 1)",
    "seed": "[0, 4294967295]",          # numpy's and torch's seeds: 0 .. 2**32 - 1
}
# csv_metric choices by task kind; rmse is lower-is-better (kit.train.metrics.task_score negates it)
CSV_METRICS = {"regression": ("rmse", "pearson", "spearman"),
               "classification": ("accuracy", "f1", "f1_macro", "mcc")}
NOT_A_TASK = ("csv", "multitask")      # task names that are no registry task


def inside(value: float, interval: str) -> bool:
    """Whether `value` lies in an interval written like "[0, 1)"."""
    low, high = (float(bound) for bound in interval[1:-1].split(","))
    above = value >= low if interval[0] == "[" else value > low
    below = value <= high if interval[-1] == "]" else value < high
    return above and below


def field_problem(cfg) -> str | None:
    """The first field outside its CHOICES or RANGES."""
    for name, allowed in CHOICES.items():
        value = getattr(cfg, name)
        for item in value if isinstance(value, tuple) else (value,):
            if item not in allowed:
                return f"parameter {name!r}: {item!r} is not one of {', '.join(allowed)}"
    for name, interval in RANGES.items():
        if not inside(getattr(cfg, name), interval):
            return f"parameter {name!r}: {getattr(cfg, name)!r} is outside {interval}"
    return None


def csv_problem(cfg) -> str | None:
    """Task csv names its file and columns; csv_test_path and csv_metric are for task csv only,
    the metric of the task's kind, and a test file needs its id column."""
    # masked-LM pretraining reads text only: a CSV without a target is fine there
    target = cfg.csv_target or methods.get(cfg.method).pretrain
    if cfg.task.lower() == "csv" and not (cfg.csv_path and cfg.csv_text_columns and target):
        return "task 'csv' needs csv_path, csv_text_columns and csv_target"
    for name in ("csv_test_path", "csv_metric"):
        if getattr(cfg, name) and cfg.task != "csv":
            return f"parameter {name!r}: for task 'csv', not {cfg.task!r}"
    kind = "regression" if cfg.csv_regression else "classification"
    if cfg.csv_metric and cfg.csv_metric not in CSV_METRICS[kind]:
        return (f"parameter 'csv_metric': {cfg.csv_metric!r} is not a {kind} metric; "
                f"choose one of {', '.join(CSV_METRICS[kind])}")
    if cfg.csv_test_path and not cfg.csv_id_column:
        return "parameter 'csv_id_column' is empty; name the test CSV's id column"
    return None


def folds_problem(cfg) -> str | None:
    """k-fold CSV runs: folds only exist for CSV tasks, and the dev fold must be one of them."""
    if cfg.n_folds < 0 or cfg.n_folds == 1:
        return f"parameter 'n_folds': {cfg.n_folds} folds; use 0 (no folds) or >= 2"
    if cfg.n_folds and cfg.task.lower() != "csv":
        return f"parameter 'n_folds': folds are for task 'csv', not {cfg.task!r}"
    if cfg.csv_fold_column and not cfg.n_folds:
        return "parameter 'csv_fold_column' needs n_folds >= 2"
    if not 0 <= cfg.fold < max(cfg.n_folds, 1):
        return (f"parameter 'fold': {cfg.fold} is outside [0, {max(cfg.n_folds, 1)}) "
                f"(n_folds={cfg.n_folds})")
    return None


def task_problem(cfg) -> str | None:
    """A task is named, and is in the registry unless it is csv or multitask."""
    if not cfg.task:
        return "parameter 'task' is empty"
    if cfg.task.lower() not in NOT_A_TASK:
        try:
            get_task(cfg.task)
        except ValueError as err:
            return f"parameter 'task': {err}"
    return None


def multitask_problem(cfg) -> str | None:
    """Method embert/gated <=> task "multitask" <=> a non-empty `tasks` of distinct known tasks."""
    multitask_methods = methods.names(multitask=True)
    multi, names = cfg.method in multitask_methods, ", ".join(multitask_methods)
    if multi != (cfg.task == "multitask"):
        return f"parameter 'task': method {cfg.method!r} needs task " + (
            "'multitask' (the tasks go in `tasks`)" if multi else f"other than 'multitask' "
            f"(multi-task methods: {names})")
    if multi != bool(cfg.tasks):
        return "parameter 'tasks': " + ("empty; list the tasks to train together" if multi
                                        else f"only for methods {names}")
    found = []
    for name in cfg.tasks:
        if name.lower() in NOT_A_TASK:
            return f"parameter 'tasks': {name!r} cannot be trained in a mix"
        try:
            found.append(get_task(name).name)
        except ValueError as err:
            return f"parameter 'tasks': {err}"
    if len(set(found)) < len(found):
        return f"parameter 'tasks': a task is listed twice in {list(cfg.tasks)}"
    return None


def stages_problem(cfg) -> str | None:
    """Gated-BERT's stages come in order: adapters, then the gate, then Q/K/V frozen."""
    if cfg.freeze_qkv_epoch < cfg.gate_start_epoch:
        return (f"parameter 'freeze_qkv_epoch': {cfg.freeze_qkv_epoch} is before "
                f"gate_start_epoch {cfg.gate_start_epoch} (stages: adapters, gate, Q/K/V frozen)")
    return None


# RunConfig fields that only masked-LM pretraining reads, with their defaults
PRETRAIN_FIELDS = {"mlm_probability": 0.15, "whole_word_mask": False,
                   "pretrain_eval_text": False, "adapted_dir": ""}


def pretrain_problem(cfg) -> str | None:
    """The pretraining knobs belong to method mlm; mlm trains no sentence head, so the knobs of
    predictions, folds and attention guiding are refused rather than silently ignored."""
    if not methods.get(cfg.method).pretrain:
        for name, default in PRETRAIN_FIELDS.items():
            if getattr(cfg, name) != default:
                return (f"parameter {name!r}: for masked-LM pretraining (method 'mlm'), "
                        f"not method {cfg.method!r}")
        return None
    if cfg.predict_test:
        return ("parameter 'predict_test': method 'mlm' predicts nothing; "
                "pretrain_eval_text trains on the test text")
    if cfg.n_folds:
        return ("parameter 'n_folds': method 'mlm' holds out a seeded 20% of a CSV's rows; "
                "folds are for fine-tuning")
    if guided(cfg.guide_loss):
        return (f"parameter 'guide_loss': {cfg.guide_loss!r} guides a fine-tuning run, "
                "not method 'mlm'")
    return None


def model_problem(cfg) -> str | None:
    return "parameter 'model' is empty" if not cfg.model else None


def graphs_problem(cfg) -> str | None:
    """A CUDA graph replays one shape: `cuda_graphs: on` trains on length buckets, so an
    explicit `length_buckets: off` contradicts it; it compiles the whole encoder, which the
    layer-wise `compile` would compile a second time; and it replays backward graphs, which
    gradient accumulation has not been verified with."""
    if cfg.cuda_graphs != "on":
        return None
    if cfg.length_buckets == "off":
        return ("parameter 'cuda_graphs': on replays one graph per length bucket; it needs "
                "length_buckets auto or on, not off")
    if cfg.compile:
        return ("parameter 'cuda_graphs': on compiles the whole encoder; leave compile false "
                "(the layer-wise compilation) with it")
    # until a GPU run verifies it (a row of kit.models.regional_compile.VERIFIED lifts this)
    if cfg.grad_accum > 1:
        return (f"parameter 'cuda_graphs': on with grad_accum {cfg.grad_accum} is not verified "
                "on a GPU (a replayed backward can overwrite accumulated gradients); use "
                "grad_accum 1, or cuda_graphs auto or off")
    return None


RULES = (field_problem, csv_problem, folds_problem, task_problem, multitask_problem,
         stages_problem, pretrain_problem, model_problem, graphs_problem)


def first_problem(cfg) -> str | None:
    """The first problem of a RunConfig whose fields have their types, in the order of RULES."""
    for rule in RULES:
        problem = rule(cfg)
        if problem:
            return problem
    return None


def guided(loss_type: str) -> bool:
    """Whether a run's loss reads attention maps (any loss_type but the task's alone): its
    encoder then runs eager attention and returns them (a run's model and the plan's probe)."""
    return loss_type != "task"
