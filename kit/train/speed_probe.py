"""The doctor's speed probe and what it predicts: a few real training steps of the embedded model
(the kit's SequenceModel, the step kit.train.loop takes, at the precision `auto` picks), timed in ~5 s,
and the wall times of the demo (`./run_all.sh`) and of the test suite (`./run_all.sh test`) it
implies on this machine, from a line fitted through machines where both were measured."""
from __future__ import annotations

import statistics
import time

import torch

# The predictions' calibration, the one place to change it: per machine, the probe's s/step
# (batch 32 x 14 tokens, 1 thread, the precision auto picks there) and the measured wall seconds
# of `./run_all.sh` (demo) and `./run_all.sh test` (suite); None where the command was not
# measured there as it is now (the suite changes more often than the demo); the precision the
# probe and the commands ran at there. predict() fits wall = overhead + k * s/step through the
# machines of the probe's precision that measured the command (least squares): a bf16 step is
# another regime (AVX2 machines 0.52-1.45 s/step put the overhead at ~300 s of the demo, which
# a bf16 machine's 0.26 s/step would double); without such a machine, through all of them.
CALIBRATION = {
    "2-core AVX2 EPYC (0.56 s/step)": {
        "precision": "no", "probe_s_per_step": 0.56, "demo_s": 312, "suite_s": 426,
        "source": "a 2-core AMD EPYC VM (AVX2 only), 2026-11-28: probe = ./run_all.sh doctor "
                  "on idle cores (0.552-0.565 s/step, 3 runs; 0.885 under a test run's load); "
                  "demo = fresh-clone-check of 4c3ca26, suite = fresh-clone-check of 0a02170, "
                  "offline, a pytest worker per core. At 0.56 the machines below predicted the "
                  "demo at 7.1 min and the suite at 4.1 min (+37%, -42%): they measured the kit "
                  "before its sync-free step and merged parameter groups and an earlier suite "
                  "(a274152 and earlier), so their commands no longer calibrate this kit's"},
    "2-core AVX2 EPYC (0.52 s/step)": {
        "precision": "no", "probe_s_per_step": 0.52, "demo_s": None, "suite_s": None,
        "source": "a 2-core AMD EPYC VM (AVX2 only), 2026-11-25: probe = ./run_all.sh doctor on "
                  "idle cores (0.50-0.53 s/step); demo (the retuned one: SST-2, CoLA, STS-B, "
                  "600-1500 rows) = fresh-clone-check of 5f1c15e, offline (the demo alternated "
                  "with the earlier one: 382 s). Its suite, 343 s with a pytest worker per core, "
                  "was the suite before the JupyterLab test"},
    "2-core AVX2 EPYC (1.16 s/step)": {
        "precision": "no", "probe_s_per_step": 1.16, "demo_s": None, "suite_s": None,
        "source": "a slower 2-core AMD EPYC VM (AVX2 only), 2026-11-26: probe = ./run_all.sh "
                  "doctor on idle cores (1.13-1.16 s/step over two days); demo and suite = "
                  "fresh-clone-check of 791edde, offline, a pytest worker per core (the demo "
                  "took 551 s and 566 s on earlier commits)"},
    "2-core AVX2 EPYC (1.45 s/step)": {
        "precision": "no", "probe_s_per_step": 1.45, "demo_s": None, "suite_s": None,
        "source": "another slow 2-core AMD EPYC VM (AVX2 only), 2026-11-25: probe = ./run_all.sh "
                  "doctor; demo (the retuned one) = the README command on a fresh clone, offline "
                  "(the README's table). Its suites (587 s, 771 s) were earlier ones"},
    "2-core AVX2 EPYC (slow)": {
        "precision": "no", "probe_s_per_step": 1.78, "demo_s": None, "suite_s": None,
        "source": "all on one 2-core AMD EPYC VM (AVX2 only, fp32 matmul peak 27-32 GFLOP/s), "
                  "2026-11-25: probe = kit.train.speed_probe.probe, fp32, load 2.4-2.9 (median "
                  "of 5: 1.70-1.94 s/step); demo = the README command on a fresh clone, "
                  "offline. Its suite (899 s) was the suite before its slowest tests were made "
                  "cheaper"},
    "2-core AVX2 EPYC (fast)": {
        "precision": "no", "probe_s_per_step": 0.926, "demo_s": None, "suite_s": None,
        "source": "another 2-core AMD EPYC VM (AVX2 only), 2026-11-25: probe = ./run_all.sh "
                  "doctor on idle cores; demo = the README command on a fresh clone of 5fc96d5; "
                  "suite = the README command on a fresh clone of 956b397 (the notebook tests "
                  "share a kernel), offline, a pytest worker per core. The demo was predicted "
                  "before it ran, from the two other machines: 8.4 min, measured 7.75"},
    "2-core avx512_bf16 EPYC": {
        "precision": "bf16", "probe_s_per_step": 0.259, "demo_s": None, "suite_s": None,
        "source": "a 2-core AMD EPYC VM with avx512_bf16 and no AMX (bf16 autocast), "
                  "2026-11-25: probe = ./run_all.sh doctor on idle cores, before either command "
                  "ran (it predicted the demo at 2.3 min); demo and suite = fresh-clone-check of "
                  "8985ab7, offline, a pytest worker per core (.ci/run on the same clone: 180 s)"},
    "2-core avx512_bf16 EPYC (a274152)": {
        "precision": "bf16", "probe_s_per_step": 0.163, "demo_s": 133, "suite_s": 218,
        "source": "a 2-core AMD EPYC VM with avx512_bf16 and no AMX (bf16 autocast), "
                  "2026-11-27: demo and suite = the README commands on a fresh clone of a274152, "
                  "offline (the suite's second run, 4 class-specific tests failing there, fixed "
                  "since). Its probe is read back from the doctor's own predictions there (demo "
                  "~5.7 min, suite ~1.2 min on the AVX2 lines: both give 0.163 s/step): the "
                  "report gave them, not the s/step"},
    "2-core AMX Xeon": {
        "precision": "bf16", "probe_s_per_step": 0.198, "demo_s": None, "suite_s": None,
        "source": "probe: bench/step_profile.py --length 14 --threads 1, bf16, the same step "
                  "(docs/benchmarks.md, quiet machine); demo: README (fresh clone, HEAD "
                  "63fff3a, 2026-11-24). Its suite (337 s, one pytest process) was the old suite"},
}
PROBE_BATCH, PROBE_LENGTH = 32, 14   # the demo's batch size; SST-2's mean length (step_profile's)
WARMUP_ROWS = 4


def time_steps(step, budget_s: float, warmup: int = 2, low: bool = False) -> tuple[float, int]:
    """Median seconds of step(True) after `warmup` cheap step(False) calls (lazy set-up,
    optimizer state, allocator), timing steps while the whole stays within budget_s (at least
    one). `low`: the lower quartile instead, which a burst of another process's load on a
    shared machine moves less (kit.plan's probes). Returns (s/step, timed steps)."""
    start = time.perf_counter()
    for _ in range(warmup):
        step(False)
    times = []
    while not times or time.perf_counter() - start + statistics.median(times) < budget_s:
        t0 = time.perf_counter()
        step(True)
        times.append(time.perf_counter() - t0)
    if low and len(times) >= 4:
        return statistics.quantiles(times, n=4)[0], len(times)
    return statistics.median(times), len(times)


def probe(device: str, precision: str, budget_s: float = 5.0, warmup: int = 2) -> dict:
    """Real training steps of the embedded model on one thread: the loop's own step
    (kit.train.step.train_step: the accelerator's autocast at `precision`, the single-task loss,
    backward, clipping, fused AdamW) on the kit's SequenceModel (bert). Fresh every time: a new
    model, optimizer and accelerator, nothing cached. `device`: the one the accelerator picks
    (kit.train.accel.machine_device), named in the result."""
    from transformers.utils import logging
    from kit.models.backbones import load_backbone
    from kit.methods.bert import HeadSpec, SequenceModel
    from kit.models.packed_dropout import use_packed_dropout
    from kit.train.accel import make_accelerator, resolve_dropout_rng
    logging.disable_progress_bar()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        accelerator = make_accelerator(precision)
        model = SequenceModel(load_backbone("minilm")[0], HeadSpec(num_labels=2)).train()
        dropout_rng = resolve_dropout_rng("auto", accelerator.device.type,
                                          accelerator.mixed_precision)
        if dropout_rng == "packed":          # as a run's loop does
            use_packed_dropout(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
        model, optimizer = accelerator.prepare(model, optimizer)
        step = stepper(accelerator, model, optimizer,
                       random_batch(PROBE_BATCH, PROBE_LENGTH, 20000, accelerator.device))
        seconds, steps = time_steps(step, budget_s, warmup)
    finally:
        torch.set_num_threads(threads)
    return {"s_per_step": round(seconds, 4), "steps": steps, "device": device,
            "precision": accelerator.mixed_precision, "dropout_rng": dropout_rng,
            "shape": f"{PROBE_BATCH} x {PROBE_LENGTH} tokens, 1 thread"}


def fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares line wall = a + k * s through (s/step, wall s) points: (a, k). One point:
    the line through it and the origin (no overhead to fit)."""
    if len(points) == 1:
        (s, t), = points
        return 0.0, t / s
    ms, mt = statistics.fmean(s for s, _ in points), statistics.fmean(t for _, t in points)
    k = sum((s - ms) * (t - mt) for s, t in points) / sum((s - ms) ** 2 for s, _ in points)
    return mt - k * ms, k


def measured(target: str, precision: str = "no", calibration: dict = CALIBRATION
             ) -> tuple[dict, bool]:
    """The machines that measured `target` ("demo_s", "suite_s") at `precision`, and True; none
    there: every machine that measured it, and False."""
    done = {name: m for name, m in calibration.items() if m.get(target) is not None}
    same = {name: m for name, m in done.items() if m.get("precision", "no") == precision}
    return (same, True) if same else (done, False)


def fits(calibration: dict = CALIBRATION, precision: str = "no"
         ) -> dict[str, tuple[float, float]]:
    """Per target, the line through the machines that measured it (`measured`)."""
    return {target: fit([(m["probe_s_per_step"], m[target])
                         for m in measured(target, precision, calibration)[0].values()])
            for target in ("demo_s", "suite_s")}


def predict(s_per_step: float, calibration: dict = CALIBRATION, precision: str = "no"
            ) -> dict[str, float]:
    """Predicted wall seconds of the demo and of the test suite for a probe's s/step."""
    return {target: round(max(a + k * s_per_step, 0.0), 1)
            for target, (a, k) in fits(calibration, precision).items()}


def prediction_line(seconds: float, s_per_step: float, calibration: dict = CALIBRATION,
                    target: str = "demo_s", precision: str = "no") -> str:
    """The prediction in words, naming the machines that measured `target`; "within 2x" only
    for a probe within 2x of theirs, at their precision."""
    machines, same = measured(target, precision, calibration)
    probes = [m["probe_s_per_step"] for m in machines.values()]
    if not same:
        why = f"none ran at precision {precision}: a rough guess"
    elif min(probes) / 2 <= s_per_step <= max(probes) * 2:
        why = "within 2x"
    else:
        why = "this probe is far outside them: a rough guess"
    return f"expected ~{seconds / 60:.1f} min (calibrated on a {' and a '.join(machines)}; {why})"


def stepper(accelerator, model, optimizer, batch: dict, loss=None):
    """step(full): one step of the loop's own train_step (`loss(model, inputs)`, by default the
    plain single-task loss; backward, clipping, the optimizer) on `batch`, or on its first
    WARMUP_ROWS rows when not `full` (a cheap warm-up), the device synchronized after it (the
    doctor's and the plan's probes)."""
    from kit.train.finetune import loss_terms
    from kit.train.step import train_step
    loss = loss or (lambda model, inputs: loss_terms(model, inputs, regression=False, alpha=1.0))

    def step(full: bool):
        inputs = {k: v if full else v[:WARMUP_ROWS] for k, v in batch.items()}
        train_step(accelerator, model, optimizer, lambda: loss(model, inputs), 1.0)
        sync_device(accelerator.device)
    return step


def sync_device(device) -> None:     # the device's queued kernels done (a CPU runs in line)
    {"cuda": torch.cuda.synchronize, "mps": torch.mps.synchronize}.get(device.type, lambda: None)()


def random_batch(rows: int, length: int, vocab: int, device) -> dict:
    ids = torch.randint(min(1000, vocab - 1), vocab, (rows, length), device=device)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids),
            "special_mask": torch.zeros_like(ids, dtype=torch.bool),
            "labels": torch.randint(0, 2, (rows,), device=device)}
