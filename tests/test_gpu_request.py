"""A GPU given to the job (SLURM, CUDA_VISIBLE_DEVICES) that the installed torch cannot use stops
both doors in one line before any kernel starts; ACCELERATE_USE_CPU=1 trains on the CPU."""
import sys

import pytest
import torch

from kit import batch
from kit import run as krun
from kit.train import gpu_request
from kit.train.gpu_request import gpu_requested, no_gpu_line, torch_build

ALL_VARS = gpu_request.GPU_COUNT_VARS + gpu_request.GPU_LIST_VARS
CPU_HINT = (f"install a CUDA build ({sys.executable} -m pip uninstall -y torch, then "
            "TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 ./run_all.sh setup; cu128 or "
            "the CUDA version nvidia-smi shows), or set ACCELERATE_USE_CPU=1 to train on the CPU")


@pytest.mark.parametrize("env, asked", [
    ({}, None),
    ({"CUDA_VISIBLE_DEVICES": ""}, None),
    ({"CUDA_VISIBLE_DEVICES": "-1"}, None),
    ({"CUDA_VISIBLE_DEVICES": "NoDevFiles"}, None),
    ({"CUDA_VISIBLE_DEVICES": "0"}, "CUDA_VISIBLE_DEVICES=0"),
    ({"CUDA_VISIBLE_DEVICES": "GPU-5fd3,GPU-77aa"}, "CUDA_VISIBLE_DEVICES=GPU-5fd3,GPU-77aa"),
    ({"SLURM_GPUS_ON_NODE": "0"}, None),
    ({"SLURM_GPUS_ON_NODE": "1"}, "SLURM_GPUS_ON_NODE=1"),
    ({"SLURM_GPUS_PER_TASK": "a100:1"}, "SLURM_GPUS_PER_TASK=a100:1"),
    ({"SLURM_GPUS": "a100:0,v100:2"}, "SLURM_GPUS=a100:0,v100:2"),
    ({"SLURM_GPUS": "a100:0"}, None),
    ({"SLURM_JOB_GPUS": "2,3"}, "SLURM_JOB_GPUS=2,3"),
    ({"SLURM_STEP_GPUS": ""}, None),
    # SLURM's own variable is named before CUDA's (the allocation, not its consequence)
    ({"CUDA_VISIBLE_DEVICES": "0", "SLURM_GPUS_ON_NODE": "1"}, "SLURM_GPUS_ON_NODE=1"),
])
def test_which_variables_give_the_job_a_gpu(env, asked):
    assert gpu_requested(env) == asked


def test_the_build_is_named_as_torch_reports_it():
    assert torch_build("2.13.0+cpu", None, None) == "torch 2.13.0+cpu (a CPU-only build)"
    assert torch_build("2.13.0+cu128", "12.8", None) == "torch 2.13.0+cu128 (CUDA 12.8)"
    assert torch_build("2.13.0+rocm6.4", None, "6.4") == "torch 2.13.0+rocm6.4 (ROCm 6.4)"


def test_a_cuda_build_that_sees_no_gpu_points_at_the_driver_not_the_wheel():
    line = no_gpu_line("SLURM_GPUS_ON_NODE=1", "2.13.0+cu128", "12.8", None, "py")
    assert line == ("SLURM_GPUS_ON_NODE=1 gives this job a GPU, but torch 2.13.0+cu128 (CUDA "
                    "12.8) sees none: check the driver (nvidia-smi) and that the GPU was allocated "
                    "to this task, or set ACCELERATE_USE_CPU=1 to train on the CPU")


@pytest.fixture
def cpu_torch(monkeypatch):
    """The CPU wheel, whatever this machine has; no GPU variable set, no CPU switch."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch, "__version__", "2.13.0+cpu")
    for name in ALL_VARS + ("ACCELERATE_USE_CPU",):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.fixture
def stub_point(monkeypatch):
    """kit.run's point runs as a stub: `ran` lists what would have trained."""
    ran = []
    monkeypatch.setattr(krun, "execute", lambda profile, params: ran.append(params) or ("ok", ""))
    return ran


def _run(tmp_path):
    return krun.main(["task=synthetic", "model=tiny", f"outputs_dir={tmp_path / 'out'}"])


@pytest.mark.parametrize("name, value", [("SLURM_GPUS_ON_NODE", "1"),
                                         ("CUDA_VISIBLE_DEVICES", "0")])
def test_kit_run_on_a_gpu_allocation_with_cpu_torch_is_one_line(tmp_path, capsys, cpu_torch,
                                                                stub_point, name, value):
    cpu_torch.setenv(name, value)
    assert _run(tmp_path) == 2
    assert capsys.readouterr().err == (f"error: {name}={value} gives this job a GPU, but torch "
                                       f"2.13.0+cpu (a CPU-only build) cannot use it: {CPU_HINT}\n")
    assert stub_point == []


def test_kit_run_without_a_gpu_allocation_proceeds(tmp_path, capsys, cpu_torch, stub_point):
    cpu_torch.setenv("CUDA_VISIBLE_DEVICES", "-1")
    assert _run(tmp_path) == 0
    assert len(stub_point) == 1 and capsys.readouterr().err == ""


def test_accelerate_use_cpu_trains_on_the_cpu_on_purpose(tmp_path, cpu_torch, stub_point):
    cpu_torch.setenv("SLURM_GPUS_PER_TASK", "1")
    cpu_torch.setenv("ACCELERATE_USE_CPU", "1")
    assert _run(tmp_path) == 0 and len(stub_point) == 1


def test_a_batch_on_a_gpu_allocation_with_cpu_torch_stops_before_any_kernel(tmp_path, capsys,
                                                                           cpu_torch):
    cpu_torch.setattr(batch, "Kernels", lambda **kw: pytest.fail("a kernel started"))
    cpu_torch.setenv("SLURM_GPUS_PER_TASK", "a100:1")         # sbatch --gpus-per-task=a100:1
    profile = tmp_path / "p.yaml"
    profile.write_text("grid:\n  task: synthetic\n  model: tiny\n")
    assert batch.main([str(profile), "--outputs", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err == ("error: SLURM_GPUS_PER_TASK=a100:1 gives this job a GPU, "
                                       "but torch 2.13.0+cpu (a CPU-only build) cannot use it: "
                                       f"{CPU_HINT}\n")
    assert not (tmp_path / "out" / "runs").exists()
