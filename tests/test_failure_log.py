"""bench/failure_log.py, the pytest plugin bench/gpu_session.sh runs the tests with: each
failure's test id and traceback in a file as the test fails, once under pytest-xdist too."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TESTS = '''
import os
from pathlib import Path

import pytest


def test_passes():
    assert True


def test_fails():
    assert 1 + 1 == 3, "the sum is off"


@pytest.fixture
def broken():
    raise RuntimeError("the fixture broke")


def test_errors_in_setup(broken):
    pass
'''
# only in one process: the log already holds the failure of the test run before this one
EARLY = '''

def test_zz_sees_the_failure_before_it():
    assert "test_fails (call)" in Path(os.environ["FAILURE_LOG"]).read_text()
'''


def pytest_run(tmp_path: Path, body: str, *args: str) -> tuple[subprocess.CompletedProcess, str]:
    (tmp_path / "test_generated.py").write_text(body)
    log = tmp_path / "out" / "failures.txt"
    done = subprocess.run([sys.executable, "-m", "pytest", "-o", "addopts=", "-p",
                           "no:cacheprovider", "-p", "no:randomly", "-p", "bench.failure_log",
                           "--failure-log", str(log), "--rootdir", str(tmp_path), *args,
                           str(tmp_path / "test_generated.py")],
                          cwd=REPO, env={**os.environ, "FAILURE_LOG": str(log)},
                          capture_output=True, text=True, timeout=300)
    return done, log.read_text()


def entries(text: str) -> list[str]:
    """The `<node id> (<phase>)` lines that open the log's entries."""
    return [line for line in text.splitlines() if line.startswith("test_generated.py")]


@pytest.mark.parametrize("workers", [[], ["-n", "2"]])
def test_each_failure_is_written_once_with_its_id_and_traceback(tmp_path, workers):
    done, text = pytest_run(tmp_path, TESTS + ("" if workers else EARLY), *workers)
    assert done.returncode == 1, done.stdout[-2000:]
    ids = ["test_generated.py::test_fails (call)",
           "test_generated.py::test_errors_in_setup (setup)"]
    # two workers report in the order they finish
    assert (sorted(entries(text)) == sorted(ids)) if workers else (entries(text) == ids)
    assert "AssertionError: the sum is off" in text and "assert (1 + 1) == 3" in text
    assert "RuntimeError: the fixture broke" in text
    assert "test_passes" not in text and "test_zz" not in text


def test_a_test_file_that_cannot_import_is_written(tmp_path):
    done, text = pytest_run(tmp_path, "import no_such_module_here\n")
    assert done.returncode == 2
    assert entries(text) == ["test_generated.py (collect)"]
    assert "ModuleNotFoundError: No module named 'no_such_module_here'" in text
