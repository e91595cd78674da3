"""Shared test set-up: offline always; real GLUE data from the project's own copy (data/glue)."""
import os
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"          # before transformers / datasets are imported
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.pop("GLUE_DIR", None)            # tests read the project's copy, whatever the shell says
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
def kill_after_first_checkpoint():
    """`kill(cfg, env, settle, timeout)`: fit(cfg) in a child process with this process's torch
    thread count (float sums depend on it: the resumed and the straight run continue here),
    SIGKILLed `settle` s after its first checkpoint appears (inside the next epoch), as a
    preemption would; asserts it had neither ended nor written metrics.json."""
    import signal
    import subprocess
    import sys
    import time

    import torch

    from kit.runs import run_dir_of

    def kill(cfg, env=None, settle: float = 0.2, timeout: float = 240.0) -> None:
        run = run_dir_of(cfg)
        script = (f"import torch; torch.set_num_threads({torch.get_num_threads()}); "
                  f"from kit.config.run_config import RunConfig; "
                  f"from kit.train.finetune import fit; fit(RunConfig(**{cfg.to_dict()!r}))")
        started = time.time()
        proc = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        state = run / "checkpoint" / "last"   # swapped in whole when complete
        while not state.exists():
            assert proc.poll() is None, "the run ended before its first checkpoint"
            assert time.time() - started < timeout
            time.sleep(0.05)
        time.sleep(settle)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert not (run / "metrics.json").exists()      # nothing claims to be finished

    return kill


@pytest.fixture(scope="session")
def glue_dir() -> Path:
    assert GLUE_DIR.is_dir(), f"the project's GLUE copy is missing: {GLUE_DIR}"
    return GLUE_DIR


@pytest.fixture(scope="session")
def warm_kernels():
    """This test worker's warm notebook kernel (kit.kernels, as a batch runs its points;
    tests/test_batch.py checks that warm gives a fresh kernel's results). A kernel start and its
    imports of torch and transformers cost ~8 s of CPU on an AVX2 core: the notebook and batch
    tests pay it once per worker. One torch thread in the kernel, as in the runs the tests
    compare it with."""
    from kit.kernels import Kernels

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
    another); the batch's end leaves it running for the next test."""
    import contextlib

    from kit import batch

    monkeypatch.setattr(batch, "Kernels",
                        lambda fresh=False: contextlib.nullcontext(warm_kernels))
