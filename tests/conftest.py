"""Shared test set-up: offline always; real GLUE data from the project's own copy (data/glue)."""
import os
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"          # before transformers / datasets are imported
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.pop("GLUE_DIR", None)            # tests read the project's copy, whatever the shell says
# no fsync before renames (~40 a run, only a machine crash needs them; test_faults turns it on)
os.environ.setdefault("SSA_KIT_FSYNC", "0")
# pytest-xdist (./run_all.sh test runs a worker per core, at most 4): the cores are shared out
# between the workers, and the kernels and torchrun processes a test starts inherit the share
# (OMP_NUM_THREADS), so workers never oversubscribe the machine
if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1)
                                            // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))

import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

# property-based tests draw the same cases on every run (seeded): a CI failure reproduces here
settings.register_profile("kit", derandomize=True, deadline=None)
settings.load_profile("kit")

REPO = Path(__file__).resolve().parents[1]
GLUE_DIR = REPO / "data" / "glue"


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for a module (restored after it): tiny matrices run ~100x faster than on
    two threads of a shared, busy 2-core machine, and runs compared across processes need the
    same thread count (float sums depend on it). Use: pytestmark = usefixtures("one_thread")."""
    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def comparable():
    """`comparable(metrics)`: what a resumed run and its uninterrupted twin must share, bit for
    bit: everything but timings, memory and the resume marker."""
    def view(metrics: dict) -> dict:
        strip = lambda rows: [{k: v for k, v in r.items() if k != "wall_s"} for r in rows]  # noqa: E731
        return {"epochs": strip(metrics["epochs"]), "best_dev": metrics["best_dev"],
                "best_epoch": metrics["best_epoch"], "train_examples": metrics["train_examples"],
                "ssa_labels": strip(metrics["ssa_labels"])}
    return view


@pytest.fixture
def kill_at_step():
    """`kill(cfg, step, env, timeout)`: fit(cfg) in a child process with this process's torch
    thread count (float sums depend on it: the resumed and the straight run continue here) that
    SIGKILLs itself as its `step`-th training step (1-based) begins, as a preemption would. The
    fault is placed by the run's progress, not by wall time: on a fast CPU a run outpaces any
    sleep. Asserts the child died by the signal with a checkpoint and no metrics.json."""
    import signal
    import subprocess
    import sys

    import torch

    from kit.runs import run_dir_of

    def kill(cfg, step: int, env=None, timeout: float = 240.0) -> None:
        script = (f"import os, signal, torch; torch.set_num_threads({torch.get_num_threads()})\n"
                  "from kit.train import loop\n"
                  "real, calls = loop.train_step, []\n"
                  "def train_step(*args, **kwargs):\n"
                  "    calls.append(1)\n"
                  f"    if len(calls) == {step}:\n"
                  "        os.kill(os.getpid(), signal.SIGKILL)\n"
                  "    return real(*args, **kwargs)\n"
                  "loop.train_step = train_step\n"
                  "from kit.config.run_config import RunConfig\n"
                  "from kit.train.finetune import fit\n"
                  f"fit(RunConfig(**{cfg.to_dict()!r}))\n")
        done = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, timeout=timeout,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
        run = run_dir_of(cfg)
        assert (run / "checkpoint" / "last").is_dir()
        assert not (run / "metrics.json").exists()      # nothing claims to be finished

    return kill


@pytest.fixture(scope="session")
def shared_tmp(tmp_path_factory) -> Path:
    """A folder of this test run that all its pytest-xdist workers share (each worker's basetemp
    is a folder in it); without xdist, the run's own basetemp. What one worker makes there once,
    under a lock, the others find (the SLURM test cluster's users, the distributed launches)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if "PYTEST_XDIST_WORKER" in os.environ else base


@pytest.fixture(scope="session")
def glue_dir() -> Path:
    assert GLUE_DIR.is_dir(), f"the project's GLUE copy is missing: {GLUE_DIR}"
    return GLUE_DIR


@pytest.fixture(scope="session")
def warm_kernels():
    """This test worker's warm notebook kernel (kit.cluster.kernels, as a batch runs its points;
    tests/test_batch.py checks that warm gives a fresh kernel's results). A kernel start and its
    imports of torch and transformers cost ~8 s of CPU on an AVX2 core: the notebook and batch
    tests pay it once per worker. One torch thread in the kernel, as in the runs the tests
    compare it with."""
    from kit.cluster.kernels import Kernels

    with Kernels(env={"OMP_NUM_THREADS": "1"}) as kernels:
        yield kernels


@pytest.fixture(scope="session")
def run_notebook(warm_kernels):
    """`run_notebook(notebook, output, **parameters)`: papermill executes `notebook` in this test
    worker's warm kernel."""
    yield lambda notebook, output, **parameters: warm_kernels.execute(
        Path(notebook), Path(output), parameters, stderr_file=None)


@pytest.fixture
def batch_kernel(monkeypatch, warm_kernels):
    """kit.batch runs its points (and report) in this worker's warm kernel instead of starting
    one of its own. A failed point still takes the kernel with it (the next point starts
    another); the batch's end leaves it running for the next test. A batch asked for fresh
    kernels (--fresh-kernels) still starts them."""
    import contextlib

    from kit import batch

    kernels = batch.Kernels
    monkeypatch.setattr(batch, "Kernels", lambda fresh=False: (
        kernels(fresh=True) if fresh else contextlib.nullcontext(warm_kernels)))


# The longest tests first, dealt alternately to the two halves of the run order: pytest-xdist
# hands each worker a contiguous half and then steals, so a long test that starts late decides
# the suite's end (longest-first scheduling). Seconds in the suite on 2 avx512_bf16 cores.
LONGEST = ("test_jupyterlab.py::test_every_notebook_runs_in_jupyterlab",        # ~90 s
           "test_slurm.py::test_the_cluster_recipe",                            # ~50 s
           "test_slurm.py::test_a_preempted_array_task",                        # ~40 s
           # the first of the four tests on its module's SSA-H fixture: it runs the launches
           "test_distributed.py::test_a_signal_to_one_rank",                    # ~40 s
           "test_notebook_matrix.py::test_each_notebook_shows_the_runs_or_says_there_are_none[demo]",
           "test_train.py::test_ssa_labels_find_the_cue_tokens",                # ~20 s
           "test_notebook_matrix.py::test_each_notebook_shows_the_runs_or_says_there_are_none[kaggle-stsb]",
           "test_cuda_graphs.py::test_the_captured_encoder_trains_as_eager",    # ~20 s
           "test_per_device.py::test_a_signal_preempts_both_running_points",    # ~20 s
           "test_reliability.py::test_two_batches_on_one_profile_at_once",      # ~18 s
           "test_fetch.py::test_a_fetched_model_is_found_offline_by_the_plan",  # ~17 s
           "test_bench.py::test_the_gpu_benchmark_runs_end_to_end_on_a_cpu",    # ~17 s
           "test_batch.py::test_a_warm_kernel_gives_a_fresh_kernels_results",   # ~16 s
           "test_report_page.py::test_the_smoke_report_end_to_end",             # ~16 s
           "test_batch.py::test_smoke_profile_end_to_end_then_skip_and_retry",  # ~13 s
           "test_notebook_matrix.py::test_each_notebook_shows_the_runs_or_says_there_are_none[smoke]",
           "test_reliability.py::test_sigkill_mid_epoch_then_resume",           # ~11 s
           "test_distributed.py::test_other_method_families_train_on_two_processes")  # ~12 s


# The other-class lane (.ci/run; docs/usage.md): the suite again with SSA_KIT_CPU_BF16 set to the
# class this CPU is not, so that a test holding only where `auto` gives one precision fails on
# every machine. Every test is in it but these, each minutes under emulated bf16 on an AVX2 CPU:
# they train the embedded (real-size) model, or run many processes or a browser. They are left
# out for their cost alone: what they check of precision (resume, refusals, notebooks) is
# checked in the lane with tiny models by other tests, and two processes with static shapes by
# test_sync_free.py's 2-process (gloo) run against one; the rest of DDP only outside the lane.
NOT_IN_LANE = ("test_train.py::test_real_glue_smoke_per_method",
               "test_train.py::test_ssa_labels_find_the_cue_tokens_with_the_embedded_model",
               "test_distributed.py::", "test_jupyterlab.py::", "test_slurm.py::",
               "test_report_page.py::", "test_notebook_matrix.py::", "test_paper_outputs.py::",
               "test_mechanism.py::", "test_kaggle.py::",
               "test_reliability.py::test_two_batches_on_one_profile_at_once",
               "test_batch.py::test_a_warm_kernel_gives_a_fresh_kernels_results",
               "test_pretrain.py::test_pretrain_then_fine_tune_the_adapted_folder",
               "test_pretrain.py::test_a_profile_pretrains_then_fine_tunes_in_one_warm_kernel",
               "test_run.py::test_finetune_defaults_give_an_ssa_run_that_labels_tokens")


def pytest_addoption(parser):
    parser.addoption("--other-class-lane", action="store_true",
                     help="the other-class lane: SSA_KIT_CPU_BF16 set to the class this CPU is "
                          "not (unless already set), and only the tests of the lane")


def pytest_configure(config):
    if config.getoption("--other-class-lane") and not os.environ.get("SSA_KIT_CPU_BF16"):
        from kit.train.accel import cpu_bf16_in_hardware
        os.environ["SSA_KIT_CPU_BF16"] = "emulated" if cpu_bf16_in_hardware() else "native"


def pytest_collection_modifyitems(config, items):
    if config.getoption("--other-class-lane"):
        kept = [i for i in items if not any(name in i.nodeid for name in NOT_IN_LANE)]
        config.hook.pytest_deselected(items=[i for i in items if i not in kept])
        items[:] = kept

    def rank(item):
        return next((i for i, name in enumerate(LONGEST) if name in item.nodeid), None)
    longest = sorted((item for item in items if rank(item) is not None), key=rank)
    rest = [item for item in items if rank(item) is None]
    first, second = longest[0::2], longest[1::2]
    half = len(items) // 2 - len(first)
    items[:] = first + rest[:half] + second + rest[half:]
