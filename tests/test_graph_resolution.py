"""What `cuda_graphs` and `length_buckets` resolve to (kit.models.regional_compile.decide_graphs,
resolve_graphs) is part of what a run computes: `auto` replays graphs only for a combination a
GPU run verified (VERIFIED, empty today), never over an explicit `length_buckets: off`; the
resolution is recorded in config.json, metrics.json and the checkpoint's hardware record, and a
resume that resolves otherwise is refused in one line. The resolver is pure: a GPU's answers are
asked on this CPU by naming the device."""
import json

import pytest

import kit.models.regional_compile as regional
from kit.config.run_config import ConfigError, RunConfig
from kit.models.regional_compile import Resolved, decide_graphs, resolve_graphs
from kit.runs import checkpoint_dir, read_config, read_metrics, run_dir_of
from kit.train.checkpoint_hardware import CheckpointError
from kit.train.finetune import fit

from tests.test_faults import TINY, killed_after_epoch_0, rewrite_progress

pytestmark = pytest.mark.usefixtures("one_thread")      # conftest.py

ON_CPU = "CUDA graphs need a CUDA GPU; this run trains on cpu"
BERT_ROW = regional.Verified("bert", 1, 1, "pretended: a GPU run compared with eager")


@pytest.fixture
def bert_verified(monkeypatch):
    """A table whose one row is plain BERT at grad_accum 1 in one process (pretended)."""
    monkeypatch.setattr(regional, "VERIFIED", (BERT_ROW,))


def unverified(method: str, grad_accum: int = 1, processes: int = 1) -> str:
    return (f"no GPU run has verified graphs for {method} at grad_accum {grad_accum} on "
            f"{processes} process(es) (kit.models.regional_compile.VERIFIED)")


@pytest.mark.parametrize("method, steps", [("bert", 6315), ("ssa-h", 10**6), ("bert-mask", 10**6),
                                           ("ssa-co", 4200)])
def test_auto_stays_eager_on_a_gpu_where_no_gpu_run_verified_graphs(method, steps):
    """SST-2 at the defaults (6,315 steps) and every SSA or BERT-mask run trained with graphs
    under auto before; the one GPU measurement compared speed only, so nothing is verified."""
    assert decide_graphs("auto", "cuda", steps, method) == (False, unverified(method))


@pytest.mark.parametrize("args, settings, want", [
    (("cuda", 4200, "bert"), {}, (True, "4,200 planned steps; verified: " + BERT_ROW.evidence)),
    (("cuda", 4199, "bert"), {}, (False, "4,199 planned steps, under the 4,200 that pay for the "
                                         "compilation")),
    (("cuda", 10**5, "ssa-h"), {}, (False, unverified("ssa-h"))),
    (("cuda", 10**5, "bert", 2), {}, (False, unverified("bert", 2))),
    (("cuda", 10**5, "bert", 1, 2), {}, (False, unverified("bert", 1, 2))),
    (("cpu", 10**5, "bert"), {}, (False, ON_CPU)),
    (("cuda", 10**5, "bert"), {"length_buckets": "off"},
     (False, "length_buckets: off was asked, and graphs replay one per length bucket")),
    (("cuda", 10**5, "bert"), {"guide_loss": "task+pd"},
     (False, "attention guiding has not met the graphs on a GPU")),
    (("cuda", None, "bert"), {}, (False, "graphs if its planned steps reach 4,200 (counted as "
                                         "it starts)")),
])
def test_auto_replays_only_a_verified_combination(bert_verified, args, settings, want):
    assert decide_graphs("auto", *args, **settings) == want


@pytest.mark.parametrize("requested", ["on", "off"])
def test_an_explicit_value_stands(bert_verified, requested):
    assert decide_graphs(requested, "cuda", 10, "ssa-h", 1, 4) == (
        requested == "on", f"cuda_graphs: {requested} was asked")


def test_an_explicit_length_buckets_off_keeps_auto_eager(bert_verified):
    """auto never overrides an explicit user value: where graphs would replay, `off` keeps the
    run eager on batches of their own length."""
    assert resolve_graphs(RunConfig(), "cuda", 10**5, 1) == Resolved(
        "on", "on", "100,000 planned steps; verified: " + BERT_ROW.evidence)
    assert resolve_graphs(RunConfig(length_buckets="off"), "cuda", 10**5, 1) == Resolved(
        "off", "off", "length_buckets: off was asked, and graphs replay one per length bucket")


def test_graphs_on_with_gradient_accumulation_is_refused_in_one_line():
    with pytest.raises(ConfigError) as err:
        RunConfig(cuda_graphs="on", grad_accum=2)
    assert str(err.value) == (
        "parameter 'cuda_graphs': on with grad_accum 2 is not verified on a GPU (a replayed "
        "backward can overwrite accumulated gradients); use grad_accum 1, or cuda_graphs auto "
        "or off")
    assert RunConfig(grad_accum=2).cuda_graphs == "auto"          # auto: eager there


def test_a_run_records_what_it_resolved(tmp_path):
    """config.json's `resolved` block, metrics.json and the checkpoint's hardware record; the
    config.json still reads back as the run's config."""
    cfg = RunConfig(**TINY, outputs_dir=str(tmp_path), save_checkpoints=True)
    metrics = fit(cfg)
    run = run_dir_of(cfg)
    want = {"cuda_graphs": "off", "length_buckets": "off", "cuda_graphs_reason": ON_CPU}
    assert read_config(run)["resolved"] == want
    assert RunConfig.from_dict(read_config(run)) == cfg
    assert {k: read_metrics(run)[k] for k in want} == {k: metrics[k] for k in want} == want
    progress = json.loads((checkpoint_dir(run) / "last" / "progress.json").read_text())
    assert {k: progress["written_on"][k] for k in want} == want
    assert "resolved" not in progress          # its one copy in a checkpoint: written_on


@pytest.mark.parametrize("other_hardware", [False, True])
def test_a_resume_that_resolves_otherwise_is_refused_in_one_line(tmp_path, monkeypatch,
                                                                 other_hardware):
    """A checkpoint written with graphs (as a GPU under an older rule resolved them) is another
    computation: refused whatever resume_on_other_hardware says, naming both resolutions."""
    cfg = killed_after_epoch_0(tmp_path, monkeypatch)
    last = rewrite_progress(cfg, cuda_graphs="on", length_buckets="on")
    with pytest.raises(CheckpointError) as err:
        fit(RunConfig(**{**TINY, "resume_on_other_hardware": other_hardware},
                      outputs_dir=cfg.outputs_dir))
    assert str(err.value) == (
        f"{last} was written with cuda_graphs on, length_buckets on; this run resolves "
        f"cuda_graphs off, length_buckets off ({ON_CPU}): resume it where it resolves the same, "
        "or delete that folder to restart the run from scratch")
    rewrite_progress(cfg, cuda_graphs="off", length_buckets="off")      # the same: it resumes
    assert fit(cfg)["resumed_after_epoch"] == 0
