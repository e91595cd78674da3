"""Mixed precision: what `auto` resolves to, and that bf16 autocast really runs in training,
probing and evaluation while weights, optimizer state, losses and predictions stay fp32."""
import numpy as np
import pytest
import torch

from kit.train import accel
from kit.train.accel import make_accelerator, resolve_precision
from kit.models.backbones import load_backbone
from kit.config.run_config import RunConfig
from kit.data.pipeline import collate, encode, load_task_data
from kit.train.loop import predict_logits as _predict_logits
from kit.methods.bert import HeadSpec, SequenceModel
from kit.train.finetune import fit
from kit.train.finetune import loss_terms as _loss_terms

CPU_ONLY = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU branch of auto")


@pytest.mark.parametrize("requested, cuda, cuda_bf16, cpu_bf16, want", [
    ("auto", False, False, True, "bf16"),     # CPU with avx512_bf16 / AMX
    ("auto", False, False, False, "no"),      # CPU without: fp32
    ("auto", True, True, False, "bf16"),
    ("auto", True, False, True, "fp16"),      # an old GPU: the CPU's features do not matter
    ("no", False, False, True, "no"),         # explicit values stand
    ("bf16", False, False, False, "bf16"),
    ("fp16", True, True, True, "fp16"),
])
def test_resolve_precision(requested, cuda, cuda_bf16, cpu_bf16, want):
    assert resolve_precision(requested, cuda, cuda_bf16, cpu_bf16) == want


@pytest.mark.parametrize("caps, want", [
    ({"avx512_f": True, "avx512_bf16": True, "amx_bf16": False}, True),
    ({"avx512_f": True, "amx_tile": True, "amx_bf16": True}, True),
    ({"avx512_f": True, "avx2": True, "amx_tile": True}, False),   # AVX-512 alone: emulated bf16
    ({"architecture": "aarch64", "bf16": True}, False),
])
def test_native_bf16_is_read_from_the_cpu_capabilities(monkeypatch, caps, want):
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: caps)
    assert accel.cpu_has_native_bf16() is want


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
    batch = collate(examples, list(range(8)), tokenizer.pad_token_id)
    seen = []
    model.classifier.register_forward_hook(lambda m, i, out: seen.append(out.dtype))
    return cfg, model, optimizer, accelerator, examples, batch, tokenizer.pad_token_id, seen


@pytest.mark.parametrize("precision, compute", [("bf16", torch.bfloat16), ("no", torch.float32)])
def test_autocast_in_training_and_prediction_with_fp32_weights_losses_and_logits(precision,
                                                                                 compute):
    cfg, model, optimizer, accelerator, examples, batch, pad_id, seen = _tiny_setup(precision)
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


def test_a_tiny_run_in_bf16_records_its_precision(tmp_path):
    m = fit(RunConfig(task="synthetic", model="tiny", method="ssa-h", synthetic_size=64, epochs=2,
                      lr=5e-3, mixed_precision="bf16", save_checkpoints=False,
                      outputs_dir=str(tmp_path)))
    assert m["status"] == "ok" and m["mixed_precision"] == "bf16"
    assert m["ssa_labels"][-1]["probed"] == 64
    assert np.isfinite(m["epochs"][-1]["train_loss"])
