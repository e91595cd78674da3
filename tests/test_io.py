"""kit.io: the run lock is portable (no fcntl at import) and exclusive across processes; the
array format round-trips exactly and refuses anything that could run code (a pickle)."""
import json
import os
import pickle
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from kit.runs import arrays
from kit.io import FileLock

REPO = Path(__file__).resolve().parents[1]


def _python(code: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


def test_kit_io_imports_without_fcntl(tmp_path):
    """As on Windows: `import fcntl` fails, kit.io (and the train module that takes the lock)
    still imports and the lock still works."""
    done = _python("""
        import sys
        sys.modules["fcntl"] = None          # every `import fcntl` now raises ImportError
        try:
            import fcntl
        except ImportError:
            pass
        else:
            raise SystemExit("fcntl still importable")
        import kit.io
        with kit.io.FileLock(sys.argv[1]) as got:
            print("got", got)
        """, str(tmp_path / ".lock"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["got", "True"]


def test_two_processes_contend_for_one_lock(tmp_path):
    """A second process is refused while the first holds the lock, and gets it once released."""
    lock = tmp_path / "run" / ".lock"
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import sys
        from kit.io import FileLock
        with FileLock(sys.argv[1]) as got:
            print("held" if got else "refused", flush=True)
            sys.stdin.readline()             # hold until the test says so
        """), str(lock)], cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        contender = """
            import sys
            from kit.io import FileLock
            with FileLock(sys.argv[1]) as got:
                print(got)
            """
        assert _python(contender, str(lock)).stdout.strip() == "False"
        with FileLock(lock) as got:
            assert not got
        holder.stdin.write("\n")
        holder.stdin.flush()
        assert holder.wait(timeout=60) == 0
        assert _python(contender, str(lock)).stdout.strip() == "True"
    finally:
        holder.kill()


def test_lock_is_released_when_holder_dies(tmp_path):
    """A killed holder leaves no stale lock (the OS drops it with the process)."""
    lock = tmp_path / ".lock"
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import sys, time
        from kit.io import FileLock
        with FileLock(sys.argv[1]) as got:
            print(got, flush=True)
            time.sleep(600)
        """), str(lock)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "True"
        with FileLock(lock) as got:
            assert not got
    finally:
        holder.kill()
        holder.wait(timeout=60)
    with FileLock(lock) as got:
        assert got


# ---------------------------------------------------------------- write_arrays / read_arrays

FUZZ = settings(max_examples=100, derandomize=True, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])
DTYPES = [np.bool_, np.int8, np.int32, np.int64, np.uint16, np.uint64, np.float16, np.float32,
          np.float64, np.dtype(">i4"), np.dtype("<U3")]
names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,6}", fullmatch=True)


@st.composite
def ragged(draw):
    """A list of 1-D arrays of one dtype: empty lists and zero-length rows included; floats
    with NaN, inf and -0.0."""
    dtype = draw(st.sampled_from(DTYPES))
    return draw(st.lists(hnp.arrays(dtype, st.integers(0, 5)), max_size=6))


arrays_ = st.sampled_from(DTYPES).flatmap(
    lambda dtype: hnp.arrays(dtype, hnp.array_shapes(min_dims=0, max_dims=3, min_side=0)))
json_ = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5)
                     | st.floats(allow_nan=False),
                     lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(st.text(max_size=4), inner, max_size=3), max_leaves=8)


def same_array(a, b) -> bool:
    """Bit-exact: dtype, shape and bytes (NaN payloads and -0.0 included)."""
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@FUZZ
@given(fields=st.dictionaries(names, st.none() | ragged() | arrays_, max_size=5),
       meta=st.dictionaries(st.text(max_size=5), json_, max_size=4))
def test_arrays_round_trip_bit_exactly(tmp_path, fields, meta):
    path = tmp_path / "a.npz"
    arrays.write_arrays(path, fields, meta)
    back, meta_back = arrays.read_arrays(path)
    assert list(back) == list(fields) and meta_back == meta
    for name, value in fields.items():
        if value is None or isinstance(value, np.ndarray):
            assert value is None and back[name] is None or same_array(value, back[name]), name
        else:
            assert isinstance(back[name], list) and len(back[name]) == len(value), name
            assert all(same_array(a, b) for a, b in zip(value, back[name])), name
    assert [p.name for p in tmp_path.iterdir()] == ["a.npz"]       # no temp file left


def test_write_arrays_refuses_what_it_cannot_give_back(tmp_path):
    path = tmp_path / "a.npz"
    bad = {"mixes dtypes": {"x": [np.zeros(2, np.int64), np.zeros(1, np.int32)]},
           "Python objects": {"x": np.array([{}], dtype=object)},
           "other than 1-D": {"x": [np.zeros((2, 2))]},
           "not an identifier": {"a.values": np.zeros(1)},
           "not an array": {"x": 3}}
    for message, fields in bad.items():
        with pytest.raises(ValueError, match=message):
            arrays.write_arrays(path, fields, {})
    assert not path.exists()


class RunsCode:
    """Unpickling this runs a shell command that creates a marker file: the attack a pickle in
    a shared outputs/ folder is."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {shlex.quote(str(self.marker))}",)


def crafted_files(folder: Path, marker: Path) -> dict[str, Path]:
    """Files no reader may load: pickles (plain and torch.save's zip), an npz whose header is
    the kit's but whose member is a pickled object, and non-pickles that are not the format."""
    folder.mkdir(parents=True, exist_ok=True)
    files = {name: folder / name for name in ("pickle.npz", "torch.npz", "legacy-torch.npz",
                                              "objects.npz", "no-header.npz", "single.npy",
                                              "garbage.npz", "empty.npz")}
    files["pickle.npz"].write_bytes(pickle.dumps(RunsCode(marker)))
    torch.save({"epoch_set": RunsCode(marker)}, files["torch.npz"])
    torch.save(RunsCode(marker), files["legacy-torch.npz"], _use_new_zipfile_serialization=False)
    header = {"format": arrays.ARRAYS_FORMAT, "fields": {"x": "array"}, "meta": {}}
    with open(files["objects.npz"], "wb") as f:
        np.savez(f, **{"x": np.array([RunsCode(marker)], dtype=object),
                       arrays.HEADER: np.array(json.dumps(header))})
    with open(files["no-header.npz"], "wb") as f:
        np.savez(f, x=np.zeros(3))
    np.save(files["single.npy"], np.zeros(3))
    files["garbage.npz"].write_bytes(b"\x00not an array file at all")
    files["empty.npz"].write_bytes(b"")
    return files


def test_the_crafted_pickle_does_run_code_when_unpickled(tmp_path):
    """The payload is real: an unsafe load (what the kit did before) creates the marker."""
    marker = tmp_path / "ran"
    files = crafted_files(tmp_path / "files", marker)
    torch.load(files["torch.npz"], weights_only=False)
    assert marker.exists()


def test_read_arrays_refuses_anything_but_its_format_without_running_it(tmp_path):
    marker = tmp_path / "ran"
    for name, path in crafted_files(tmp_path / "files", marker).items():
        with pytest.raises(arrays.UnsafeFileError) as err:
            arrays.read_arrays(path)
        message = str(err.value)
        assert "\n" not in message and str(path) in message, (name, message)
        assert "refused, not the kit's array format" in message, (name, message)
    assert not marker.exists()
    with pytest.raises(FileNotFoundError):
        arrays.read_arrays(tmp_path / "absent.npz")
