"""One typed, validated config for every knob of a run.

`RunConfig.from_dict` is the only way parameters (notebook, YAML profile, test) become a run:
unknown names, wrong types and out-of-range values stop here with a one-line error.
"""
from __future__ import annotations

import dataclasses
import difflib
import functools
import hashlib
import json
import typing
from dataclasses import dataclass

from kit.config import rules as config_rules
from kit import methods
from kit.config.notebook_cells import cell_parameters
from kit.config.tasks import canonical_task_name

RESULTS_VERSION = 5  # bump when a default or the training code changes what a config computes
# 4: one loop without DataLoaders (kit.train.loop): torch's RNG is no longer drawn per loader, so
#    dropout streams, and results, differ from version 3 like another seed
# 5: cuda_graphs: auto graphs only the combinations a GPU run verified (none yet): CUDA runs of
#    4,200+ steps (SST-2, QNLI, QQP, MNLI at the defaults), compiled with graphs, length buckets,
#    padded rows and inductor's dropout stream under 4, train eagerly again
METHODS = methods.names()                       # the registry: kit/methods/__init__.py
SSA_METHODS = methods.names(epoch="ssa-labels")
MULTITASK_METHODS = methods.names(multitask=True)   # kit.train.multitask; task="multitask"


# config.json's record of what a run's `auto` settings became (kit.models.regional_compile.
# resolve_graphs), written beside its parameters: reading a config.json back takes the parameters
RESOLVED = "resolved"


class ConfigError(ValueError):
    """A bad parameter; the message is one line naming the parameter."""


# Names other tools use for a RunConfig field (transformers' TrainingArguments, run_glue.py,
# the SSA and StructBERT scripts). They are answered with "did you mean 'lr'?", not accepted:
# one spelling per knob keeps profiles, notebook parameters and tables unambiguous.
PARAMETER_ALIASES = {
    "learning_rate": "lr", "num_train_epochs": "epochs", "num_epochs": "epochs",
    "n_epochs": "epochs", "per_device_train_batch_size": "batch_size",
    "train_batch_size": "batch_size", "per_device_eval_batch_size": "eval_batch_size",
    "model_name_or_path": "model", "model_name": "model", "task_name": "task",
    "max_seq_length": "max_length", "max_seq_len": "max_length", "warmup": "warmup_ratio",
    "warmup_proportion": "warmup_ratio", "gradient_accumulation_steps": "grad_accum",
    "output_dir": "outputs_dir", "logging_steps": "log_every", "data_dir": "glue_dir",
    "lr_decay_factor": "layer_decay", "num_folds": "n_folds",
    "text_columns": "csv_text_columns", "target_column": "csv_target",
    "label_column": "csv_target", "id_column": "csv_id_column", "do_predict": "predict_test",
}


def knob(default, help: str):
    """A RunConfig field: its default and its help text (`python -m kit.run --help` lists it)."""
    return dataclasses.field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class RunConfig:
    # what to run
    task: str = knob("synthetic", "GLUE name (RTE, SST-2 ...), synthetic, synthetic-pair, csv")
    model: str = knob("minilm", "minilm (embedded), tiny (random, tests), hub id, local folder")
    method: str = knob("bert", "bert | bert-mask | ssa-co | ssa-h; mlm: masked-LM pretraining on "
                               "the task's text (TAPT, kit.train.pretrain)")
    seed: int = 0
    # data
    glue_dir: str = knob("", 'local GLUE folder; "" -> $GLUE_DIR, else the hub; "hub" forces hub')
    max_train_examples: int = knob(0, "0 = all; else the first N (seeded shuffle) of train")
    max_length: int = 128
    synthetic_size: int = knob(2000, "train examples of the synthetic task (dev is a quarter)")
    synthetic_spurious: float = knob(0.0, "synthetic: train phi correlation of a shortcut word "
                                          "with the label (dev: independent); 0 = no shortcut "
                                          "word")
    synthetic_distractors: int = knob(0, "synthetic: distractor words per sentence, N-3..N+3; 0 = "
                                         "5-11")
    csv_path: str = ""
    csv_text_columns: tuple[str, ...] = ()
    csv_target: str = ""
    csv_regression: bool = True
    csv_test_path: str = knob("", "a test CSV (text columns + id column): submission.csv")
    csv_id_column: str = knob("id", "the test CSV's id column, first column of submission.csv")
    csv_metric: str = knob("", 'selection metric; "" = rmse (regression), mean of accuracy and '
                               "f1_macro (classification); choices: config_rules.CSV_METRICS")
    # k-fold CSV runs (Kaggle style: one run per fold, each validated on its fold; see
    # kit.data.folds)
    n_folds: int = knob(0, "0 = no folds: a seeded 80/20 split; else k >= 2 folds")
    fold: int = knob(0, "with n_folds: the fold that is dev (train = every other row)")
    csv_fold_column: str = knob("", 'a fold column of the CSV; "" = assigned (fixed seed 0, '
                                    "stratified: classes / target quantile bins)")
    # optimisation
    epochs: int = 3
    batch_size: int = 32
    eval_batch_size: int = 128
    lr: float = 2e-5
    weight_decay: float = 0.01
    warmup_ratio: float = 0.1
    max_grad_norm: float = 1.0
    grad_accum: int = 1
    layer_decay: float = knob(1.0, "layer-wise lr decay (StructBERT lr_decay_factor); 1 = off")
    freeze_layers: int = knob(0, "freeze the N lowest modules (embeddings count as the first)")
    group_by_length: bool = True
    length_buckets: str = knob("auto", "auto | off | on: batches padded to multiples of 16 tokens "
                                       "and batch_size rows (few shapes: a GPU's first-use "
                                       "costs); auto: off everywhere until a GPU measures it "
                                       "(docs/gpu.md)")
    mixed_precision: str = knob("auto", "auto | no | bf16 | fp16; auto: bf16 (else fp16) on GPU, "
                                        "bf16 on CPUs with avx512_bf16 / AMX, else none (fp32)")
    compile: bool = knob(False, "torch.compile the encoder's layer (kit.models.regional_compile)")
    cuda_graphs: str = knob("auto", "auto | off | on: the encoder compiled with mode "
                                    "reduce-overhead (CUDA graphs, one per length bucket; implies "
                                    "length_buckets); auto: on only for the CUDA runs of "
                                    "4,200+ steps whose combination a GPU run verified, none "
                                    "yet (kit.models.regional_compile.VERIFIED)")
    dropout_rng: str = knob("auto", "auto | torch | packed: dropout's mask from 16-bit lanes of "
                                    "random words (kit.models.packed_dropout); auto: packed for "
                                    "bf16 on a CPU (kit.train.accel.resolve_dropout_rng)")
    # SSA and BERT-mask (defaults follow the paper; see docs/ssa.md for the released-code switches)
    alpha: float = knob(0.7, "loss = alpha * L_target + (1 - alpha) * L_SSA")
    beta: float = knob(0.5, "hybrid: R_o = beta * R_CLS + (1 - beta) * sum_i w_i R_i")
    gamma: float = knob(1.0, "masked variants per kept sentence per epoch")
    mask_ratio: float = knob(0.3, 'share of real word-pieces masked per variant ("ratio" scheme)')
    mask_scheme: str = knob("ratio", "ratio | spans (released code: aug/rm thresholds, quartiles)")
    label_rule: str = knob("paper", "paper (masked: flip -> 1, else 0) | code (see docs/ssa.md)")
    label_merge: str = knob("union", "union: labels ride on the sentence | variant: extra "
                                     "examples")
    hybrid_weighting: str = knob("paper", "paper: softmax of p(important) | code: of p>=thr | "
                                          "logodds")
    attention_threshold: float = knob(0.3, "code weighting: tokens with p(important) below are "
                                           "dropped")
    share_weight: bool = knob(True, "False: one SSA classifier per position (code's "
                                    "share_weight=0)")
    ssa_start_epoch: int = knob(1, "first epoch (0-based) trained with generated data")
    regression_tolerance: float = knob(0.3, 'regression: "correct" and "unchanged" mean within '
                                            "this")
    aug_threshold: float = knob(0.1, "spans scheme: chance a word-piece starts a masked span")
    rm_threshold: float = knob(0.7, "spans scheme: span length 1 / 2 / 3 with p 0.4 / 0.3 / 0.3")
    code_share_step: float = knob(0.2, "code rule: share of SSA examples grows by this per epoch")
    code_share_max: float = 0.8
    save_labels: bool = knob(False, "write generated SSA labels per epoch into the run folder")
    reuse_labels_from: str = knob("", "a run folder whose saved labels replace probing")
    budget: str = knob("epochs", "epochs | equal_steps: every epoch trains len(train) rows "
                                 "(BERT-mask's / variant-merge SSA's epochs subsampled)")
    # attention guiding (Wang et al. 2022), on top of any method
    guide_loss: str = knob("task", "task | task+pd | task+ad | task+both")
    pd_factor: float = 0.001
    ad_factor: float = 0.001
    # multi-task (methods embert / gated, kit.train.multitask): `task` is the label "multitask" and
    # `tasks` lists the tasks trained together (one head each); single-task methods leave it ()
    tasks: tuple[str, ...] = knob((), "e.g. (RTE, CoLA, STS-B, SST-2, WNLI)")
    sampling: str = knob("anneal", "task of each batch: prop | sqrt | anneal | round-robin")
    steps_per_epoch: int = knob(0, "batches per epoch; 0 = total train rows / batch_size")
    adapter_rank: int = knob(0, "gated: Q/K adapter rank; 0 = hidden * 204 / 768 (BERT-base 204)")
    gate_start_epoch: int = knob(1, "gated: epochs before this train the adapters, gate fixed")
    freeze_qkv_epoch: int = knob(2, "gated: from this epoch the last layer's base Q/K/V are "
                                    "frozen")
    guide_reduction: str = knob("query", "query (attention received) | key (released code; "
                                         "~constant)")
    # masked-LM pretraining (method mlm, kit.train.pretrain: TAPT / ITPT); the adapted model is what a
    # later fine-tuning point takes as `model`
    mlm_probability: float = knob(0.15, "share of real tokens masked: 80% [MASK], 10% random, 10% "
                                        "kept")
    whole_word_mask: bool = knob(False, "mask every piece of a chosen word (all [MASK] there)")
    pretrain_eval_text: bool = knob(False, "also train on the dev and test text (no labels): "
                                           "Kaggle's ITPT; a GLUE dev score after it is no longer "
                                           "held out")
    adapted_dir: str = knob("", "also write the best model here (a plain HF folder); a profile "
                                'writes "{outputs}/adapted/NAME" (kit.config.profiles)')
    # outputs
    outputs_dir: str = "outputs"
    save_checkpoints: bool = knob(True, "keep checkpoint/ after the run (every run writes it "
                                        "while it trains, so a preempted one resumes)")
    # mid-epoch checkpoints (kit.train.run_state): every N minutes and / or every N optimizer
    # steps (0 = off); a signal (SIGTERM, SIGUSR1, SIGINT) also writes one before the run stops
    checkpoint_minutes: float = 10.0
    checkpoint_steps: int = 0
    # resume a checkpoint written with another precision, device or number of processes (refused
    # otherwise: not bit-exact); metrics.json notes it (resumed_on_other_hardware)
    resume_on_other_hardware: bool = False
    predict_test: bool = False
    save_epoch_predictions: bool = knob(False, "predictions/dev_epoch<N>.tsv every epoch (OOF per "
                                               "epoch)")
    log_every: int = 10
    profile: str = ""
    report_to: tuple[str, ...] = knob(("auto",), "trackers: auto (TensorBoard if installed) | "
                                                 "none | tensorboard, wandb, mlflow, trackio "
                                                 "(kit.train.tracking)")
    rerun: bool = knob(False, "train a finished run again (kept until the new one ends ok)")

    # fields that do not change what is computed; they stay out of the run id
    _NOT_IDENTITY = ("glue_dir", "outputs_dir", "save_checkpoints", "checkpoint_minutes",
                     "checkpoint_steps", "resume_on_other_hardware", "save_labels", "profile",
                     "log_every", "eval_batch_size", "save_epoch_predictions", "report_to",
                     "rerun")

    def __post_init__(self):
        _check_types(self)
        _normalise_task_names(self)
        _check_values(self)

    @classmethod
    def from_dict(cls, params: dict) -> "RunConfig":
        names = [f.name for f in dataclasses.fields(cls)]
        params = {k: v for k, v in params.items() if k != RESOLVED}   # a run's config.json
        for key in params:
            if key not in names:
                raise ConfigError(unknown_parameter(key, names))
        hints = field_types(cls)
        return cls(**{k: _as_tuple(v) if hints[k] == tuple[str, ...] else v
                      for k, v in params.items()})

    @classmethod
    def from_namespace(cls, namespace: dict, ignore: tuple[str, ...] = ()) -> "RunConfig":
        """A notebook's config (`globals()`): what its parameters cell and papermill's injected
        cell assign, nothing a later cell sets (kit.config.notebook_cells; an unknown name there
        is an error, except the notebook's own names in `ignore`). Without IPython's input
        history (a script's globals): the namespace's values of the fields."""
        names = {f.name for f in dataclasses.fields(cls)}
        params = cell_parameters(namespace, names)
        if params is not None:
            return cls.from_dict({k: v for k, v in params.items() if k not in ignore})
        for alias in PARAMETER_ALIASES.keys() & namespace.keys():   # papermill -p learning_rate
            raise ConfigError(unknown_parameter(alias, names))       # would be dropped silently
        return cls.from_dict({k: v for k, v in namespace.items() if k in names})

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @property
    def run_id(self) -> str:
        """Stable across processes: a hash of the fields that change the result and differ from
        their defaults, so adding a knob (with a default) keeps every earlier run id. Changing a
        default's value changes results: bump RESULTS_VERSION with it."""
        identity = {"version": RESULTS_VERSION}
        identity.update({f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                         if f.name not in self._NOT_IDENTITY
                         and getattr(self, f.name) != f.default})
        digest = hashlib.sha1(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:10]
        return f"{self.task}-{self.method}-s{self.seed}-{digest}"

    @property
    def uses_ssa(self) -> bool:
        return self.method in SSA_METHODS

    @property
    def reads_test(self) -> bool:
        """Whether a run reads its test split's text: to predict it, or to pretrain on it."""
        return self.predict_test or self.pretrain_eval_text


def unknown_parameter(key: str, names) -> str:
    """The one-line answer to a name that is no RunConfig field: the field another tool calls
    `key` (learning_rate -> lr), else the closest field name (difflib), else no hint."""
    meant = PARAMETER_ALIASES.get(key) or next(iter(difflib.get_close_matches(key, names, n=1)), None)
    return f"unknown parameter {key!r}" + (f" (did you mean {meant!r}?)" if meant else "")


def _as_tuple(value):
    """A list, or a bare string for a one-item list (`csv_text_columns: text`), as a tuple."""
    if isinstance(value, str):
        return (value,)
    return tuple(value) if isinstance(value, list) else value


def _normalise_task_names(cfg) -> None:
    """`task` and `tasks` in the registry's spelling (sst2 -> SST-2) before the run id is
    computed; unknown names are left for kit.config.rules to report."""
    def canonical(name: str) -> str:
        try:
            return canonical_task_name(name)
        except ValueError:
            return name
    object.__setattr__(cfg, "task", canonical(cfg.task))
    object.__setattr__(cfg, "tasks", tuple(canonical(name) for name in cfg.tasks))


@functools.cache
def field_types(cls=None) -> dict:
    """RunConfig's field types, by name (cached: get_type_hints takes ms, and profiles
    validate thousands of points)."""
    return typing.get_type_hints(cls or RunConfig)


def _type_ok(value, hint) -> bool:
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint == tuple[str, ...]:
        return isinstance(value, tuple) and all(isinstance(v, str) for v in value)
    return isinstance(value, hint)


def _check_types(cfg: RunConfig) -> None:
    for name, hint in field_types(type(cfg)).items():
        value = getattr(cfg, name)
        if not _type_ok(value, hint):
            want = getattr(hint, "__name__", str(hint))
            extra = (" (YAML reads 1e-5 as a string: write 1.0e-5)"
                     if isinstance(value, str) and hint is float else "")
            raise ConfigError(f"parameter {name!r}: expected {want}, got "
                              f"{type(value).__name__} {value!r}{extra}")
        if hint is float:
            object.__setattr__(cfg, name, float(value))


def _check_values(cfg: RunConfig) -> None:
    """Choices, ranges and cross-field rules, declared in kit.config.rules."""
    problem = config_rules.first_problem(cfg)
    if problem:
        raise ConfigError(problem)
