"""Devices and mixed precision: the device a run picks (CUDA, MPS, CPU), what `auto` resolves to
there, that bf16 and fp16 autocast really run in training, probing and evaluation while weights,
optimizer state, losses and predictions stay fp32, and fp16's loss scaler: an overflowing step is
skipped, nothing non-finite reaches the records, and kill -9 resume restores the scaler exactly."""
import json
import math
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from kit.train import accel, loop, run_state
from kit import runs
from kit.train.accel import (choose_device, explain_mps_errors, machine_device, machine_precision,
                             make_accelerator, mps_missing_op, resolve_precision)
from kit.models.backbones import load_backbone
from kit.config.run_config import RunConfig
from kit.data.pipeline import encode, load_task_data
from kit.data.tensors import collate
from kit.train.checkpoint_hardware import describe
from kit.train.step import predict_logits as _predict_logits, to_device
from kit.methods.bert import HeadSpec, SequenceModel
from kit.train.finetune import fit
from kit.runs import run_dir_of
from kit.train.finetune import loss_terms as _loss_terms
from kit.train.window import NonFiniteLoss, check_finite

CPU_ONLY = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU branch of auto")
REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("requested, cuda, cuda_bf16, cpu_bf16, mps, want", [
    ("auto", False, False, True, False, "bf16"),     # CPU with avx512_bf16 / AMX
    ("auto", False, False, False, False, "no"),      # CPU without: fp32
    ("auto", True, True, False, False, "bf16"),
    ("auto", True, False, True, False, "fp16"),      # an old GPU: the CPU's features do not matter
    ("auto", False, False, True, True, "no"),        # MPS: fp32 (its bf16 / fp16 not measured)
    ("no", False, False, True, False, "no"),         # explicit values stand
    ("bf16", False, False, False, False, "bf16"),
    ("fp16", True, True, True, False, "fp16"),
    ("fp16", False, False, False, True, "fp16"),
    ("bf16", False, False, False, True, "bf16"),
])
def test_resolve_precision(requested, cuda, cuda_bf16, cpu_bf16, mps, want):
    assert resolve_precision(requested, cuda, cuda_bf16, cpu_bf16, mps) == want


@pytest.mark.parametrize("cuda, mps, want", [
    (False, False, "cpu"), (False, True, "mps"), (True, False, "cuda"), (True, True, "cuda")])
def test_choose_device(cuda, mps, want):
    assert choose_device(cuda, mps) == want


def _machine(monkeypatch, cuda: bool, mps: bool, capability: tuple = (7, 5)) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: capability)
    monkeypatch.setattr(torch.version, "hip", None)
    # torch's default answer on a V100 / T4 / P100 too (bf16 emulated there): must not be read
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: mps)
    monkeypatch.setattr(accel, "cpu_has_native_bf16", lambda: True)   # must not matter off CPU
    monkeypatch.delenv("ACCELERATE_USE_CPU", raising=False)


def test_a_mac_trains_on_mps_in_fp32(monkeypatch):
    _machine(monkeypatch, cuda=False, mps=True)
    assert machine_device() == "mps"
    assert machine_precision("auto") == "no"
    assert machine_precision("bf16") == "bf16"


@pytest.mark.parametrize("gpu, capability, want", [
    ("P100", (6, 0), "fp16"), ("V100", (7, 0), "fp16"), ("T4", (7, 5), "fp16"),
    ("A100", (8, 0), "bf16"), ("L4", (8, 9), "bf16"), ("H100", (9, 0), "bf16")])
def test_cuda_wins_over_mps_and_auto_follows_the_gpu_generation(monkeypatch, gpu, capability,
                                                                  want):
    _machine(monkeypatch, cuda=True, mps=True, capability=capability)
    assert machine_device() == "cuda"
    assert machine_precision("auto") == want


def test_accelerate_use_cpu_keeps_a_run_on_the_cpu(monkeypatch):
    _machine(monkeypatch, cuda=True, mps=True, capability=(9, 0))
    monkeypatch.setenv("ACCELERATE_USE_CPU", "1")
    assert machine_device() == "cpu"
    assert machine_precision("auto") == "bf16"       # the CPU's own answer (native bf16 here)


@pytest.mark.parametrize("device, requested, tf32", [
    ("cuda", "auto", True), ("cuda", "no", False), ("cuda", "bf16", False), ("cpu", "auto", None)])
def test_tf32_is_set_per_run_on_cuda_only(device, requested, tf32):
    flags = torch.backends.cuda.matmul, torch.backends.cudnn
    before = [f.allow_tf32 for f in flags]
    try:
        for f in flags:                      # what an earlier run in this kernel may have left
            f.allow_tf32 = not tf32 if tf32 is not None else True
        accel.set_tf32(device, requested)
        want = [True, True] if tf32 is None else [tf32, tf32]     # CPU: left as they were
        assert [f.allow_tf32 for f in flags] == want
    finally:
        for f, value in zip(flags, before):
            f.allow_tf32 = value


@pytest.mark.parametrize("mps, cpu", [(True, False), (False, True)])
def test_the_process_state_is_on_the_run_device(monkeypatch, mps, cpu):
    """kit.train.accel.process_state (the lock / broadcast frame of every run) and the Accelerator
    must agree on the device: accelerate keeps the first one a process asks for."""
    import accelerate
    _machine(monkeypatch, cuda=False, mps=mps)
    monkeypatch.setattr(accelerate, "PartialState", lambda cpu: {"cpu": cpu})
    assert accel.process_state() == {"cpu": cpu}


def test_memory_on_mps_is_the_metal_drivers(monkeypatch):
    calls = []
    monkeypatch.setattr(accel, "machine_device", lambda: "mps")
    monkeypatch.setattr(torch.mps, "empty_cache", lambda: calls.append("empty"))
    monkeypatch.setattr(torch.mps, "driver_allocated_memory", lambda: 1536 * 2**20 + 52429)
    accel.reset_peak_memory()
    assert calls == ["empty"]
    assert accel.peak_memory_mb() == 1536.1


# torch's text (2.x, PYTORCH_ENABLE_MPS_FALLBACK unset), as it reaches Python
MPS_ERROR = ("The operator 'aten::_linalg_solve_ex.result' is not currently implemented for the "
             "MPS device. If you want this op to be added in priority during the prototype "
             "phase of this feature, please comment on https://github.com/pytorch/pytorch/issues/"
             "77764.\nAs a temporary fix, you can set the environment variable "
             "`PYTORCH_ENABLE_MPS_FALLBACK=1` to use the CPU as a fallback for this op. WARNING: "
             "this will be slower than running natively on MPS.")
MPS_LINE = ("operator aten::_linalg_solve_ex.result is not implemented on MPS: set "
            "PYTORCH_ENABLE_MPS_FALLBACK=1 in the environment before Python starts (torch reads "
            "it at import) to run it on the CPU, or ACCELERATE_USE_CPU=1 to train on the CPU")


def test_a_missing_mps_operator_is_one_line_naming_it_and_the_variable():
    assert mps_missing_op(MPS_ERROR) == MPS_LINE
    assert mps_missing_op("not implemented for 'Half'") is None

    @explain_mps_errors()
    def missing(message):
        raise NotImplementedError(message)

    with pytest.raises(NotImplementedError) as err:
        missing(MPS_ERROR)
    assert str(err.value) == MPS_LINE
    with pytest.raises(NotImplementedError) as err:
        missing("not implemented for 'Half'")
    assert str(err.value) == "not implemented for 'Half'" and err.value.__cause__ is None


def test_a_run_failing_on_a_missing_mps_operator_records_that_line(tmp_path, monkeypatch):
    import kit.train.finetune as train

    def missing(*args):
        raise NotImplementedError(MPS_ERROR)

    monkeypatch.setattr(train, "target_loss", missing)
    cfg = RunConfig(task="synthetic", model="tiny", synthetic_size=16, epochs=1,
                    save_checkpoints=False, outputs_dir=str(tmp_path))
    with pytest.raises(NotImplementedError, match="^operator aten::_linalg_solve_ex.result"):
        fit(cfg)
    record = json.loads((run_dir_of(cfg) / "metrics.json").read_text())
    assert record["status"] == "failed"
    assert record["error"] == f"NotImplementedError: {MPS_LINE}"


@pytest.mark.parametrize("caps, want", [
    ({"avx512_f": True, "avx512_bf16": True, "amx_bf16": False}, True),
    ({"avx512_f": True, "amx_tile": True, "amx_bf16": True}, True),
    ({"avx512_f": True, "avx2": True, "amx_tile": True}, False),   # AVX-512 alone: emulated bf16
    ({"architecture": "aarch64", "bf16": True}, False),
])
def test_native_bf16_is_read_from_the_cpu_capabilities(monkeypatch, caps, want):
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: caps)
    monkeypatch.delenv(accel.CPU_BF16_SWITCH, raising=False)
    assert accel.cpu_has_native_bf16() is accel.cpu_bf16_in_hardware() is want


@pytest.mark.parametrize("hardware", [True, False])
@pytest.mark.parametrize("switch, want", [("native", True), ("emulated", False),
                                          (" Native ", True), ("", None)])
def test_the_class_switch_overrides_the_hardware_for_auto_only(monkeypatch, hardware, switch,
                                                               want):
    """SSA_KIT_CPU_BF16 makes `auto` resolve as on the other class (the tests' second lane);
    unset, the hardware decides. What the CPU really has stays in cpu_bf16_in_hardware."""
    caps = {"avx2": True, "avx512_bf16": hardware}
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: caps)
    monkeypatch.setenv(accel.CPU_BF16_SWITCH, switch)
    assert accel.cpu_has_native_bf16() is (hardware if want is None else want)
    assert accel.cpu_bf16_in_hardware() is hardware


def test_a_misspelt_class_switch_is_one_line(monkeypatch):
    monkeypatch.setenv(accel.CPU_BF16_SWITCH, "amx")
    with pytest.raises(ValueError, match=r"^SSA_KIT_CPU_BF16='amx': use one of native, emulated "
                                         r"\(or leave it unset: this CPU decides\)$"):
        accel.cpu_has_native_bf16()


@CPU_ONLY
@pytest.mark.parametrize("native, want", [(True, "bf16"), (False, "no"), (True, "bf16")])
def test_auto_follows_the_detector_and_may_change_within_a_process(monkeypatch, native, want):
    """Three accelerators in a row in one process (bf16, fp32, bf16): accelerate's singleton
    state would refuse the second without the reset."""
    monkeypatch.setattr(accel, "cpu_has_native_bf16", lambda: native)
    assert make_accelerator().mixed_precision == want
    assert make_accelerator("no").mixed_precision == "no"


def _tiny_setup(precision: str):
    """A tiny ssa-h model prepared by the kit's accelerator, a batch with SSA labels, and a hook
    that records the dtype the classifier computes in."""
    torch.manual_seed(0)
    cfg = RunConfig(task="synthetic", model="tiny", method="ssa-h", synthetic_size=16,
                    mixed_precision=precision)
    data = load_task_data(cfg)
    backbone, tokenizer = load_backbone("tiny")
    model = SequenceModel(backbone, HeadSpec(num_labels=2, method="ssa-h"))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    accelerator = make_accelerator(cfg.mixed_precision)
    model, optimizer = accelerator.prepare(model, optimizer)
    examples = encode(tokenizer, data.train, cfg.max_length, regression=False)
    examples = examples.with_ssa_labels([np.where(s, -100, i % 2) for i, s in
                                         enumerate(examples.special)])
    # on the device prepare() moved the model to, as the loop's batches are
    batch = to_device(collate(examples, list(range(8)), tokenizer.pad_token_id),
                      accelerator.device)
    seen = []
    model.classifier.register_forward_hook(lambda m, i, out: seen.append(out.dtype))
    return cfg, model, optimizer, accelerator, examples, batch, tokenizer.pad_token_id, seen


@pytest.mark.parametrize("precision, compute", [("bf16", torch.bfloat16),
                                                ("fp16", torch.float16), ("no", torch.float32)])
def test_autocast_in_training_and_prediction_with_fp32_weights_losses_and_logits(precision,
                                                                                 compute):
    cfg, model, optimizer, accelerator, examples, batch, pad_id, seen = _tiny_setup(precision)
    # fp16 adds a loss scaler (CPU too: the kit switches accelerate's fp16 path on there)
    assert (accelerator.scaler is not None) is (precision == "fp16")
    model.train()
    terms = _loss_terms(model, batch, regression=False, alpha=cfg.alpha)
    assert seen == [compute]                                  # the forward ran in `compute`
    assert {k: v.dtype for k, v in terms.items()} == dict.fromkeys(
        ["loss", "loss_target", "loss_ssa"], torch.float32)
    assert all(torch.isfinite(v) for v in terms.values())
    accelerator.backward(terms["loss"])
    optimizer.step()
    assert {p.dtype for p in model.parameters()} == {torch.float32}            # master weights
    assert {p.grad.dtype for p in model.parameters() if p.grad is not None} == {torch.float32}
    assert {s["exp_avg"].dtype for s in optimizer.state.values()} == {torch.float32}

    seen.clear()
    logits = _predict_logits(model, examples, 5, pad_id, accelerator)   # probing and eval path
    assert seen == [compute] * 4                               # 16 rows in batches of 5
    assert logits.dtype == np.float32 and logits.shape == (16, 2)
    with torch.inference_mode():
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                    special_mask=batch["special_mask"], token_type_ids=batch["token_type_ids"])
    assert out["logits"].dtype == out["token_logits"].dtype == torch.float32


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_a_tiny_run_records_its_precision(tmp_path, capfd, precision):
    m = fit(RunConfig(task="synthetic", model="tiny", method="ssa-h", synthetic_size=64, epochs=2,
                      lr=5e-3, mixed_precision=precision, save_checkpoints=False,
                      outputs_dir=str(tmp_path)))
    assert m["status"] == "ok" and m["mixed_precision"] == precision
    assert m["ssa_labels"][-1]["probed"] == 64
    assert np.isfinite(m["epochs"][-1]["train_loss"])
    # progress lines count epochs from 1; the records keep the 0-based index
    assert [e["epoch"] for e in m["epochs"]] == [0, 1]
    lines = [line for line in capfd.readouterr().err.splitlines() if ": dev " in line]
    assert [line.split(":")[0] for line in lines] == ["epoch 1/2", "epoch 2/2"]


# ---------------------------------------------------------------- fp16's loss scaler

def test_an_overflowing_fp16_step_is_skipped_and_leaves_the_weights(one_thread):
    cfg, model, optimizer, accelerator, examples, batch, pad_id, seen = _tiny_setup("fp16")
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    model.train()
    for overflow in (True, False):                  # the loop's step: backward, clip, step
        terms = _loss_terms(model, batch, regression=False, alpha=cfg.alpha)
        accelerator.backward(terms["loss"] * (math.inf if overflow else 1.0))
        accelerator.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if overflow:                                  # skipped: not one weight moved
            assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
            assert {int(s["step"]) for s in optimizer.state.values()} == {0}
    # the scale halved once (2**16 -> 2**15); the clean step then updated every weight
    assert accelerator.scaler.get_scale() == 2.0**15
    assert {int(s["step"]) for s in optimizer.state.values()} == {1}
    assert not any(torch.equal(before[k], v) for k, v in model.state_dict().items())


@pytest.mark.parametrize("precision, hint", [
    ("fp16", "; fp16 autocast: activations may have left fp16's range (65504), bf16 or no would "
             "keep them"),
    ("bf16", "")])
def test_a_non_finite_loss_still_stops_the_run_under_fp16(precision, hint):
    """The losses are fp32 under every precision: a non-finite one is no gradient overflow."""
    window = torch.tensor([[0.5, 0.7], [math.nan, 0.7]])
    with pytest.raises(NonFiniteLoss) as err:
        check_finite(window, ["loss", "loss_target"], 1, 12, precision)
    assert str(err.value) == "non-finite loss at epoch 1 step 12: loss=nan, loss_target=0.7" + hint


def overflow_once(made: list):
    """kit.train.loop.make_accelerator whose first backward overflows (inf gradients everywhere, the
    loss itself finite): the scaler must skip that step. Appends each accelerator to `made`."""
    def make(*args, **kwargs):
        accelerator = make_accelerator(*args, **kwargs)
        real, calls = accelerator.backward, []

        def backward(loss, **kw):
            calls.append(1)
            real(loss * math.inf if len(calls) == 1 else loss, **kw)

        accelerator.backward = backward
        made.append(accelerator)
        return accelerator
    return make


FP16 = dict(task="synthetic", model="tiny", method="ssa-h", synthetic_size=64, epochs=2, lr=5e-3,
            batch_size=8, mixed_precision="fp16", log_every=1)


def test_an_fp16_overflow_is_skipped_not_recorded_and_keeps_the_schedule(tmp_path, monkeypatch,
                                                                         one_thread):
    made = []
    monkeypatch.setattr(loop, "make_accelerator", overflow_once(made))
    cfg = RunConfig(**FP16, save_checkpoints=False, outputs_dir=str(tmp_path / "overflow"))
    m = fit(cfg)
    assert m["status"] == "ok" and made[0].scaler.get_scale() == 2.0**15    # one skip, no growth
    history = runs.read_history(run_dir_of(cfg))
    assert len(history) == 16 and np.isfinite(history.drop(columns="epoch").to_numpy()).all()
    assert all(np.isfinite(e["train_loss"]) and np.isfinite(e["dev"]["score"]) for e in m["epochs"])
    monkeypatch.undo()
    clean = RunConfig(**FP16, save_checkpoints=False, outputs_dir=str(tmp_path / "clean"))
    assert fit(clean)["status"] == "ok"
    # lr follows the position in the data: the skipped step shifted nothing
    assert history["lr"].tolist() == runs.read_history(run_dir_of(clean))["lr"].tolist()


def test_kill_9_after_an_fp16_checkpoint_resumes_the_loss_scale_exactly(tmp_path, monkeypatch,
                                                                         one_thread, comparable):
    """The killed run overflowed once (scale 2**15, not a fresh scaler's 2**16) and died by
    SIGKILL right after its epoch-0 checkpoint; resuming loads scaler.pt's state exactly and
    ends where an uninterrupted run ends."""
    killed = RunConfig(**FP16, outputs_dir=str(tmp_path / "killed"))
    script = (f"import sys, os, signal, torch; torch.set_num_threads({torch.get_num_threads()}); "
              "sys.path.insert(0, 'tests'); from test_precision import overflow_once; "
              "from kit.train import loop, run_state; from kit.config.run_config import RunConfig; "
              "from kit.train.finetune import fit; loop.make_accelerator = overflow_once([]); "
              "save = run_state.save_checkpoints; "
              "run_state.save_checkpoints = lambda *a: (save(*a), "
              "os.kill(os.getpid(), signal.SIGKILL)); "
              f"fit(RunConfig(**{killed.to_dict()!r}))")
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    run = run_dir_of(killed)
    assert not (run / "metrics.json").exists()
    saved = torch.load(run / "checkpoint" / "last" / "scaler.pt")
    assert saved["scale"] == 2.0**15 and saved["_growth_tracker"] == 7     # 8 steps, 1 skipped

    loaded = []
    resume = run_state.resume
    monkeypatch.setattr(run_state, "resume", lambda accelerator, *a: (
        resume(accelerator, *a), loaded.append(accelerator.scaler.state_dict()))[0])
    resumed = fit(killed)
    assert resumed["resumed_after_epoch"] == 0 and loaded == [saved]

    monkeypatch.undo()
    monkeypatch.setattr(loop, "make_accelerator", overflow_once([]))
    straight = fit(RunConfig(**FP16, outputs_dir=str(tmp_path / "straight")))
    assert comparable(resumed) == comparable(straight)


@pytest.mark.parametrize("wrote, resumes", [("fp16", "no"), ("bf16", "fp16")])
def test_a_checkpoint_across_the_fp16_scaler_is_refused_in_one_line(tmp_path, monkeypatch,
                                                                   one_thread, wrote, resumes):
    """`auto` is one run id on every machine but resolves per machine (a T4 session's fp16, a
    CPU session's fp32): a checkpoint with scaler.pt cannot resume without a scaler, or the
    reverse; the error names both precisions instead of calling the checkpoint corrupt."""
    cfg = RunConfig(**{**FP16, "mixed_precision": "auto", "epochs": 1}, outputs_dir=str(tmp_path))
    monkeypatch.setattr(accel, "machine_precision", lambda requested: wrote)
    fit(cfg)
    last = run_dir_of(cfg) / "checkpoint" / "last"
    assert (last / "scaler.pt").exists() is (wrote == "fp16")
    # this machine's record (`fp16 on cpu x1`, or on cuda with the GPU's name): the hardware
    # differs in precision only
    written = json.loads((last / "progress.json").read_text())["written_on"]
    assert describe(written).startswith(f"{wrote} on {machine_device()} x1")
    (run_dir_of(cfg) / "metrics.json").unlink()      # as if killed after the checkpoint
    monkeypatch.setattr(accel, "machine_precision", lambda requested: resumes)
    with pytest.raises(run_state.CheckpointError) as err:
        fit(cfg)
    assert str(err.value) == (
        f"{last} was written with {describe(written)}; this run has "
        f"{describe({**written, 'precision': resumes})} "
        "(mixed_precision auto resolves per machine): "
        "resume it on hardware like that, set resume_on_other_hardware: true to resume anyway "
        "(not bit-exact), or delete that folder to restart the run from scratch")
