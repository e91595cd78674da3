"""kit.doctor: the report's sections and decisions (device, precision with its reason, processes,
GLUE, offline) on monkeypatched machines, the prediction's arithmetic (kit.train.speed_probe), the real
command with --no-probe --json, and the probe itself once with one timed step."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kit.train import accel, provenance, speed_probe
from kit import doctor
from kit.models import regional_compile

REPO = Path(__file__).resolve().parents[1]
SECTIONS = ["machine", "decisions", "data and models", "software"]


@pytest.fixture
def machine(monkeypatch):
    """A machine to order: set(cuda=, cuda_bf16=, mps=, cpu_bf16=); provenance answers fixed."""
    monkeypatch.delenv("ACCELERATE_USE_CPU", raising=False)
    monkeypatch.delenv(accel.CPU_BF16_SWITCH, raising=False)     # the lane's: this machine decides
    monkeypatch.setattr(provenance, "cpu_info", lambda: {
        "model": "Test CPU", "arch": "x86_64", "flags": ["avx2"], "native_bf16": False,
        "cpu_class": "avx2"})
    monkeypatch.setattr(provenance, "gpu_info", lambda: None)
    monkeypatch.setattr(provenance, "versions", lambda: {"torch": "9.9"})
    monkeypatch.setattr(doctor, "kit_commit", lambda: ("abc1234", True))

    def set_(cuda=False, cuda_bf16=False, mps=False, cpu_bf16=False):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
        monkeypatch.setattr(accel, "cuda_has_native_bf16", lambda: cuda_bf16)
        monkeypatch.setattr(torch.backends.mps, "is_available", lambda: mps)
        monkeypatch.setattr(accel, "cpu_has_native_bf16", lambda: cpu_bf16)
    return set_


@pytest.mark.parametrize("hardware, device, line", [
    ({}, "cpu", "no — CPU without avx512_bf16/AMX: bf16 is emulated there, slower than fp32"),
    ({"cpu_bf16": True}, "cpu", "bf16 — CPU with avx512_bf16/AMX: native bf16 matmuls, "
                                "bf16 autocast"),
    ({"cuda": True, "cuda_bf16": True}, "cuda",
     "bf16 — the CUDA GPU has bf16 tensor cores: bf16 autocast (and TF32 matmuls)"),
    ({"cuda": True}, "cuda", "fp16 — the CUDA GPU has no bf16 tensor cores (compute capability "
                             "< 8.0): fp16 autocast with a loss scaler"),
    ({"mps": True, "cpu_bf16": True}, "mps",
     "no — Apple MPS: its bf16 / fp16 autocast were never measured, so fp32"),
])
def test_device_and_the_precision_auto_picks_with_its_reason(machine, hardware, device, line):
    machine(**hardware)
    picked, precision, forced = doctor.decide()
    assert (picked, forced) == (device, False)
    assert doctor.precision_line(picked, precision) == line
    assert doctor.report()["decisions"]["precision (auto)"] == line


def test_accelerate_use_cpu_keeps_a_gpu_machine_on_the_cpu(machine, monkeypatch):
    machine(cuda=True, cuda_bf16=True)
    monkeypatch.setenv("ACCELERATE_USE_CPU", "1")
    device, precision, forced = doctor.decide()
    assert (device, precision, forced) == ("cpu", "no", True)
    assert doctor.device_line(device, forced, "none") == "cpu — ACCELERATE_USE_CPU is set"


def test_report_sections_and_keys(machine, monkeypatch, tmp_path):
    machine(cuda=True, cuda_bf16=True)
    monkeypatch.setattr(provenance, "gpu_info", lambda: {
        "kind": "cuda", "name": "Test GPU", "count": 2, "capability": "9.0", "bf16": True})
    import accelerate.commands.config as acc
    monkeypatch.setattr(acc, "default_config_file", str(tmp_path / "default_config.yaml"))
    sections = doctor.report()
    assert list(sections) == SECTIONS
    assert list(sections["machine"]) == ["cpu", "cpu flags", "native bf16 (cpu)", "gpu"]
    assert sections["machine"]["cpu flags"] == ("has avx2; lacks avx512_f, avx512_bf16, amx_tile, "
                                                "amx_bf16, amx_fp16, avx512_fp16")
    assert sections["machine"]["native bf16 (cpu)"] == (
        "no — no avx512_bf16 / AMX: bf16 matmuls are emulated")
    gpu = "Test GPU x2, compute capability 9.0, bf16 yes"
    assert sections["machine"]["gpu"] == gpu
    assert sections["decisions"]["device"] == f"cuda — CUDA GPU: {gpu}"
    assert list(sections["decisions"]) == ["device", "precision (auto)", "compile",
                                           "cuda_graphs (auto)", "accelerate launch",
                                           "kit processes", "trackers"]
    assert sections["decisions"]["compile"].startswith("off — ")
    assert sections["decisions"]["cuda_graphs (auto)"].startswith(
        "off for every run — no GPU run has verified graphs against eager yet")
    assert doctor.graphs_line("cpu") == ("off — CUDA graphs replay on a CUDA GPU only; this "
                                         "machine trains on cpu")
    row = regional_compile.Verified("bert", 1, 1, "abc1234, H200, losses and scores")
    assert doctor.graphs_line("cuda", (row,)) == (
        "on for runs of 4,200+ steps of bert at grad_accum 1 on 1 process(es), with no attention "
        "guiding and length_buckets not off; else off — verified: abc1234, H200, losses and "
        "scores")
    assert sections["decisions"]["accelerate launch"].startswith("1 — no accelerate config")
    assert sections["decisions"]["trackers"] == ("installed: tensorboard; report_to auto -> "
                                                 "tensorboard")
    data = sections["data and models"]
    assert data["glue (the project's copy)"] == (f"CoLA, SST-2, STS-B, RTE, WNLI in "
                                                 f"{REPO / 'data' / 'glue'}")
    assert data["glue missing"] == ("MRPC (hub only); QQP (hub only); MNLI (hub only); "
                                    "QNLI (hub only)")
    assert data["embedded model"].startswith("found — ")
    assert data["offline"] == "yes — HF_HUB_OFFLINE=1 is set: local models and data only"
    assert sections["software"] == {"torch": "9.9",
                                    "kit commit": "abc1234 (tracked files changed)"}
    text = doctor.render(sections)
    assert "\n\n[decisions]\ndevice: " in text
    rows = [line for line in text.splitlines() if line and not line.startswith("[")]
    assert len({len(row) - len(row.split(": ", 1)[1].lstrip()) for row in rows}) == 1  # aligned


def test_accelerate_config_sets_the_launch_processes(tmp_path):
    config = tmp_path / "default_config.yaml"
    config.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_CPU\n"
                      "mixed_precision: 'no'\nuse_cpu: true\nnum_processes: 4\ndebug: false\n")
    assert doctor.launch_processes(config, 0) == f"4 — from {config}"
    assert doctor.launch_processes(tmp_path / "none.yaml", 2).startswith(
        "2 — no accelerate config")


def test_glue_dir_is_searched_first(monkeypatch, tmp_path):
    (tmp_path / "RTE").mkdir()
    for split in ("train", "dev"):
        (tmp_path / "RTE" / f"{split}.tsv").write_text("index\n")
    monkeypatch.setenv("GLUE_DIR", str(tmp_path))
    lines = doctor.glue_lines()
    assert lines["glue (GLUE_DIR)"] == f"RTE in {tmp_path}"      # per task: the rest from
    assert lines["glue (the project's copy)"].startswith("CoLA, SST-2, STS-B")   # data/glue
    assert lines["glue missing"] == ("MRPC (hub only); QQP (hub only); MNLI (hub only); "
                                     "QNLI (hub only)")
    monkeypatch.setenv("GLUE_DIR", str(tmp_path / "absent"))
    assert doctor.glue_lines()["glue"].startswith(f"error — GLUE_DIR={tmp_path / 'absent'}: ")


def test_offline_lines():
    env = {"HF_HUB_OFFLINE": "1"}
    assert doctor.offline_lines(env, "HF_HUB_OFFLINE=1 is set") == {
        "offline": "yes — HF_HUB_OFFLINE=1 is set: local models and data only",
        "offline env": "HF_HUB_OFFLINE=1, TRANSFORMERS_OFFLINE unset"}
    assert doctor.offline_lines({}, None)["offline"] == (
        "no — the hub answers: hub models and GLUE's hub copy work")


def test_the_precision_line_names_the_class_switch_when_set():
    assert doctor.precision_line("cpu", "bf16", True) == (
        "bf16 — SSA_KIT_CPU_BF16=native is set: `auto` resolves as on a CPU with native bf16, "
        "whatever this one has")
    assert doctor.precision_line("cpu", "no", False).startswith("no — SSA_KIT_CPU_BF16=emulated")
    assert doctor.precision_line("cpu", "no") == doctor.precision_line("cpu", "no", None)
    assert doctor.precision_line("cuda", "bf16", True) == doctor.precision_line("cuda", "bf16")


def test_prediction_arithmetic():
    calibration = {"slow box": {"probe_s_per_step": 3.0, "demo_s": 200, "suite_s": 700},
                   "fast box": {"probe_s_per_step": 1.0, "demo_s": 100, "suite_s": 300}}
    assert speed_probe.fit([(1.0, 100), (3.0, 200)]) == (50.0, 50.0)
    assert speed_probe.fit([(0.0, 10), (1.0, 12), (2.0, 14)]) == (10.0, 2.0)
    assert speed_probe.predict(2.0, calibration) == {"demo_s": 150.0, "suite_s": 500.0}
    assert speed_probe.predict(0.0, calibration) == {"demo_s": 50.0, "suite_s": 100.0}
    assert speed_probe.prediction_line(150.0, 2.0, calibration) == (
        "expected ~2.5 min (calibrated on a slow box and a fast box; within 2x)")
    assert speed_probe.prediction_line(51.0, 0.02, calibration) == (
        "expected ~0.8 min (calibrated on a slow box and a fast box; this probe is far outside "
        "them: a rough guess)")
    assert speed_probe.fit([(2.0, 300)]) == (0.0, 150.0)      # one machine: through the origin
    unmeasured = {**calibration, "fast box": {**calibration["fast box"], "suite_s": None}}
    assert speed_probe.predict(2.0, unmeasured) == {"demo_s": 150.0, "suite_s": 466.7}
    assert speed_probe.prediction_line(466.7, 2.0, unmeasured, target="suite_s") == (
        "expected ~7.8 min (calibrated on a slow box; within 2x)")
    assert speed_probe.prediction_line(50.0, 0.5, unmeasured, target="suite_s").endswith(
        "this probe is far outside them: a rough guess)")
    # a bf16 probe is fitted on the bf16 machines only; none measured it: all, said to be a guess
    both = {**calibration, "bf16 box": {"precision": "bf16", "probe_s_per_step": 0.5,
                                        "demo_s": 40, "suite_s": None}}
    assert speed_probe.predict(1.0, both, precision="bf16") == {"demo_s": 80.0, "suite_s": 300.0}
    assert speed_probe.predict(2.0, both) == {"demo_s": 150.0, "suite_s": 500.0}
    assert speed_probe.prediction_line(80.0, 1.0, both, precision="bf16") == (
        "expected ~1.3 min (calibrated on a bf16 box; within 2x)")
    assert speed_probe.prediction_line(300.0, 1.0, both, "suite_s", "bf16") == (
        "expected ~5.0 min (calibrated on a slow box and a fast box; none ran at precision "
        "bf16: a rough guess)")
    for target in ("demo_s", "suite_s"):       # the shipped lines pass near every measured point
        for machine in speed_probe.CALIBRATION.values():
            if machine.get(target) is not None:
                got = speed_probe.predict(machine["probe_s_per_step"],
                                          precision=machine["precision"])[target]
                assert got == pytest.approx(machine[target], rel=0.25), (machine, target)


@pytest.mark.parametrize("precision", ["no", "bf16"])
def test_each_cpu_class_has_a_machine_that_measured_both_commands(precision):
    """The doctor predicts from machines of the probe's own precision (fp32: AVX2 only; bf16:
    avx512_bf16 / AMX): each class has one that measured the demo and one the suite, so its
    predictions are not the other class's line (2.6-3x off on a bf16 machine before)."""
    for target in ("demo_s", "suite_s"):
        assert speed_probe.measured(target, precision)[1], (precision, target)


def test_time_steps_warms_up_then_times_within_the_budget():
    calls = []
    seconds, steps = speed_probe.time_steps(calls.append, budget_s=0.0, warmup=2)
    assert calls == [False, False, True] and steps == 1 and seconds >= 0


def test_the_command_prints_json_without_the_probe():
    out = subprocess.run([sys.executable, "-m", "kit.doctor", "--no-probe", "--json"], cwd=REPO,
                         capture_output=True, text=True, timeout=120, check=True).stdout
    report = json.loads(out)
    assert list(report) == [*SECTIONS, "doctor", "numbers"]
    assert report["numbers"] == {}
    assert report["decisions"]["precision (auto)"].split(" — ")[0] in ("no", "bf16", "fp16")


def test_the_probe_trains_minilm_for_real():
    threads = torch.get_num_threads()
    got = speed_probe.probe("cpu", "no", budget_s=0.0, warmup=1)
    assert got["steps"] == 1 and got["s_per_step"] > 0 and torch.get_num_threads() == threads
    assert (got["device"], got["precision"], got["dropout_rng"]) == ("cpu", "no", "torch")


def test_the_speed_section(monkeypatch):
    monkeypatch.setattr(doctor, "probe", lambda device, precision, budget_s: {
        "s_per_step": 0.5, "steps": 7, "device": device, "precision": precision,
        "dropout_rng": "torch", "shape": "32 x 14 tokens, 1 thread"})
    lines, numbers = doctor.speed("cpu", "no")
    assert numbers["predicted_s"] == speed_probe.predict(0.5)
    assert lines["probe"] == "0.500 s/step — median of 7 step(s) of minilm, 32 x 14 tokens, " \
                             "1 thread, precision no, cpu, dropout torch (auto: packed for " \
                             "bf16 on a CPU)"
    assert list(lines) == ["probe", "calibration", "demo (./run_all.sh)",
                           "tests (./run_all.sh test)"]

    def fails(*args):
        raise RuntimeError("no fused AdamW here")
    monkeypatch.setattr(doctor, "probe", fails)
    assert doctor.speed("mps", "no") == (
        {"probe": "failed — RuntimeError: no fused AdamW here"}, {})


def test_the_probe_times_the_loops_own_step(monkeypatch):
    """The doctor's probe has no training step of its own: it calls kit.train.step.train_step,
    the one the loop takes (warm-up steps included)."""
    from kit.train import step
    calls, real = [], step.train_step
    monkeypatch.setattr(step, "train_step", lambda *a, **k: calls.append(1) or real(*a, **k))
    result = speed_probe.probe("cpu", "no", budget_s=0.2, warmup=1)
    assert len(calls) == result["steps"] + 1 and result["precision"] == "no"


def test_a_bad_cpu_bf16_switch_is_one_line(monkeypatch, capsys):
    from kit import doctor
    monkeypatch.setenv("SSA_KIT_CPU_BF16", "sometimes")
    assert doctor.main(["--no-probe"]) == 2
    assert capsys.readouterr().err == ("error: SSA_KIT_CPU_BF16='sometimes': use one of native, "
                                       "emulated (or leave it unset: this CPU decides)\n")
