"""Atomic writes: a file a later step reads is either complete or absent, never half-written.

Written beside, flushed to disk (fsync), renamed over the name, the folder flushed: a killed
process or a crashed node leaves the old file or the new one (unflushed, a rename may reach the
disk before the data: an empty file under the real name on ext4, XFS, Lustre).

Arrays the kit writes and reads back (saved SSA labels, a checkpoint's epoch examples) go
through `write_arrays` / `read_arrays`: an .npz of plain arrays plus a JSON header, loaded with
pickling off. outputs/ may be a folder other people write to; a pickle (torch.save, np.save of
objects) runs whatever code it names when loaded, so the kit refuses to read one back.
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
import zipfile
from contextlib import contextmanager
from pathlib import Path

import filelock
import numpy as np


class OutputsError(OSError):
    """The outputs folder cannot be written (read-only, not a folder, disk full)."""


@contextmanager
def atomic_path(path: str | Path):
    """Yield a temporary path beside `path`; on success it is renamed onto `path` (atomic on
    POSIX within one file system), on error it is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # the temp name keeps the real suffix: tools that check it (papermill: .ipynb) accept it
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=f".tmp{path.suffix}")
    os.close(fd)
    os.chmod(tmp, 0o666 & ~_umask())   # mkstemp makes 0600; results are meant to be shared
    try:
        yield Path(tmp)
        fsync(tmp)                     # the data on disk before the name points at it
        os.replace(tmp, path)
        fsync(path.parent, folder=True)     # and the rename itself
    except OSError as err:
        if err.errno == errno.ENOSPC:
            raise OutputsError(f"disk full while writing {path}; free space and rerun "
                               "(finished runs are kept, this one resumes)") from None
        raise
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def fsync(path: str | Path, folder: bool = False) -> None:
    """Flush a written file's data, or a folder's entries (new names, renames), to the disk.
    Windows cannot open a folder for that; some filesystems refuse (EINVAL): nothing to do.
    SSA_KIT_FSYNC=0 skips it (the test suite: ~40 flushes a run, only a crash needs them)."""
    if (folder and os.name == "nt") or os.environ.get("SSA_KIT_FSYNC") == "0":
        return
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if folder else 0))
    try:
        os.fsync(fd)
    except OSError as err:
        if not folder or err.errno not in (errno.EINVAL, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


def fsync_tree(path: str | Path) -> None:
    """fsync every file under `path`, then every folder, deepest first: a folder written by
    other code (accelerate's checkpoint) before it is renamed into place."""
    for folder, _, files in os.walk(path, topdown=False):
        for name in files:
            fsync(os.path.join(folder, name))
        fsync(folder, folder=True)


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def read_json(path: str | Path) -> dict:
    """A JSON object from disk, or a one-line ValueError naming the file."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: corrupt JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def write_text(path: str | Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def write_json(path: str | Path, obj) -> None:
    write_text(path, json.dumps(obj, indent=2, default=_jsonable) + "\n")


# ---------------------------------------------------------------- arrays: data, never code

ARRAYS_FORMAT = "kit-arrays/1"
HEADER = "kit-arrays.json"    # the npz member holding the JSON header; not an identifier, so
                              # no field's member can take its name


class UnsafeFileError(ValueError):
    """A file the kit reads back is not in the kit's array format (a pickle, a .pt file, an npz
    of objects, garbage): refused unread, since loading a pickle runs the code it names."""


def refused(path: str | Path, why: str, hint: str = "") -> UnsafeFileError:
    return UnsafeFileError(f"{path}: refused, not the kit's array format ({why}); the kit reads "
                           "back only .npz data written by kit.io.write_arrays, never a pickle, "
                           f"which can run code{hint}")


def write_arrays(path: str | Path, arrays: dict[str, np.ndarray | list[np.ndarray] | None],
                 meta: dict) -> None:
    """Write `arrays` and `meta` atomically as one .npz that `read_arrays` reads back exactly.

    A value is an array (any shape, any dtype but object), a ragged list of 1-D arrays of one
    dtype (stored as its concatenated values and int64 offsets: no per-row pickles, and one
    np.concatenate however many rows) or None. `meta` is JSON (numpy scalars become numbers);
    it and the fields' kinds go into a JSON string member, so nothing in the file is a pickle."""
    members, kinds = {}, {}
    for name, value in arrays.items():
        if not (isinstance(name, str) and name.isidentifier()):
            raise ValueError(f"{path}: array name {name!r} is not an identifier")
        kinds[name] = _pack(path, name, value, members)
    header = {"format": ARRAYS_FORMAT, "fields": kinds, "meta": meta}
    members[HEADER] = np.array(json.dumps(header, default=_jsonable))
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        np.savez(f, **members)     # uncompressed: an MNLI epoch writes at disk speed


def _pack(path, name: str, value, members: dict) -> str:
    """Put one field's members into `members`; its kind for the header."""
    if value is None:
        return "none"
    if isinstance(value, np.ndarray):
        _storable(path, name, value.dtype)
        members[name] = value
        return "array"
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"{path}: {name} is a {type(value).__name__}, not an array, a list of "
                         "arrays or None")
    members[f"{name}.values"], members[f"{name}.offsets"] = _flatten(path, name, value)
    return "ragged"


def _flatten(path, name: str, rows) -> tuple[np.ndarray, np.ndarray]:
    """A ragged list as (values, offsets): row i is values[offsets[i]:offsets[i + 1]]."""
    if not all(isinstance(row, np.ndarray) and row.ndim == 1 for row in rows):
        raise ValueError(f"{path}: {name} holds something other than 1-D arrays")
    dtypes = {row.dtype for row in rows}
    if len(dtypes) > 1:   # concatenating would cast them to one: the reader would not get them back
        raise ValueError(f"{path}: {name} mixes dtypes {sorted(map(str, dtypes))}; a ragged "
                         "field keeps one dtype")
    lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
    offsets = np.concatenate([np.zeros(1, np.int64), np.cumsum(lengths)])
    if not dtypes:
        return np.zeros(0, np.uint8), offsets
    dtype = dtypes.pop()
    _storable(path, name, dtype)
    # dtype= keeps it exactly: without it concatenate turns big-endian rows native
    return np.concatenate(rows, dtype=dtype), offsets


def _storable(path, name: str, dtype: np.dtype) -> None:
    if dtype.hasobject:   # np.save would pickle it, and read_arrays refuses pickles
        raise ValueError(f"{path}: {name} holds Python objects (dtype {dtype}); store numbers, "
                         "booleans or strings")


def read_arrays(path: str | Path) -> tuple[dict, dict]:
    """(arrays, meta) of a file `write_arrays` wrote: the same names in the same order, arrays
    with their dtypes and shapes, ragged fields as lists of 1-D arrays (views of one buffer),
    None fields as None; meta as JSON gives it back. Anything else - a pickle, a .pt file, an
    npz of objects or without the kit's header - raises UnsafeFileError, unloaded (a missing
    file raises FileNotFoundError)."""
    try:
        loaded = np.load(path, allow_pickle=False)
    except (ValueError, EOFError, zipfile.BadZipFile) as err:   # a pickle, garbage, empty
        raise refused(path, _reason(err)) from None
    if not isinstance(loaded, np.lib.npyio.NpzFile):
        raise refused(path, "a single .npy array, not an .npz")
    with loaded:
        try:
            return _unpack(loaded)
        except (ValueError, KeyError, TypeError, AttributeError, EOFError,
                zipfile.BadZipFile) as err:
            raise refused(path, _reason(err)) from None


def _reason(err: Exception) -> str:
    """numpy's message, said for a user: it calls anything without numpy's magic a pickle."""
    if isinstance(err, EOFError):
        return "empty or cut short"
    text = str(err).splitlines()[0] if str(err) else type(err).__name__
    if "Object arrays" in text:
        return "it holds pickled Python objects"
    return "a pickle, or not numpy data at all" if "pickle" in text else text


def _unpack(npz) -> tuple[dict, dict]:
    if HEADER not in npz.files:
        raise ValueError(f"no {HEADER} header")
    header = json.loads(str(_member(npz, HEADER, "U")[()]))
    if not isinstance(header, dict) or header.get("format") != ARRAYS_FORMAT:
        raise ValueError(f"header format is not {ARRAYS_FORMAT}")
    arrays = {}
    for name, kind in header["fields"].items():
        if kind == "none":
            arrays[name] = None
        elif kind == "array":
            arrays[name] = _member(npz, name)
        elif kind == "ragged":
            arrays[name] = _rows(_member(npz, f"{name}.values"),
                                 _member(npz, f"{name}.offsets", "i"))
        else:
            raise ValueError(f"unknown kind {kind!r} of field {name}")
    return arrays, header["meta"]


def _member(npz, key: str, kind: str = "") -> np.ndarray:
    """One .npy member (NpzFile hands back other members as raw bytes: refused here)."""
    if key not in npz.files:
        raise ValueError(f"member {key} missing")
    value = npz[key]       # allow_pickle=False: an object array raises ValueError, unloaded
    if not isinstance(value, np.ndarray) or (kind and value.dtype.kind != kind):
        raise ValueError(f"member {key} is not a {kind or 'numpy'} array")
    return value


def _rows(values: np.ndarray, offsets: np.ndarray) -> list[np.ndarray]:
    """The ragged list back: slices of one buffer (a loop of slices; np.split's per-row
    swapaxes makes it ~4x slower on 400k rows)."""
    if (values.ndim != 1 or offsets.ndim != 1 or not len(offsets) or offsets[0] != 0
            or offsets[-1] != len(values) or (np.diff(offsets) < 0).any()):
        raise ValueError("ragged offsets do not match their values")
    bounds = offsets.tolist()
    return [values[start:end] for start, end in zip(bounds[:-1], bounds[1:])]


@contextmanager
def atomic_dir(path: str | Path):
    """Yield a temporary folder beside `path` to fill; on success it replaces `path` (a
    reader sees the old folder or the new one, never a half-written one), on error it is
    removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
    os.chmod(tmp, 0o777 & ~_umask())   # mkdtemp makes 0700; results are meant to be shared
    old = tmp.with_suffix(".old")
    try:
        yield tmp
        fsync_tree(tmp)
        if path.exists():
            os.rename(path, old)
        os.rename(tmp, path)
        fsync(path.parent, folder=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)


# ---------------------------------------------------------------- a folder's files, set aside
# A folder's files but its dot-files (locks, temp files being written) move into a new hidden
# folder and back. Each rename is atomic, several are not: they go through <aside>.moving /
# <aside>.restoring, which `settle` finishes after a process died halfway.

def set_aside(folder: Path, aside: Path) -> None:
    """Move `folder`'s files into the new folder `aside`: all of them or, killed, none."""
    _move_files(folder, _staged(aside, "moving"))
    _staged(aside, "moving").rename(aside)


def put_back(folder: Path, aside: Path) -> None:
    """Replace `folder`'s files by those `set_aside` moved into `aside` (which goes)."""
    for path in [p for p in folder.iterdir() if not p.name.startswith(".")]:
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    aside.rename(_staged(aside, "restoring"))
    _move_files(_staged(aside, "restoring"), folder)


def settle(folder: Path, aside: Path) -> None:
    """Finish a `set_aside` (undone) or a `put_back` that a killed process left halfway."""
    for staged in (_staged(aside, "moving"), _staged(aside, "restoring")):
        if staged.exists():
            _move_files(staged, folder)


def _staged(aside: Path, stage: str) -> Path:
    return aside.with_name(f"{aside.name}.{stage}")


def _move_files(src: Path, dst: Path) -> None:
    dst.mkdir(parents=True, exist_ok=True)
    for path in sorted(p for p in src.iterdir() if not p.name.startswith(".")):
        path.rename(dst / path.name)
    if src.name.endswith((".moving", ".restoring")):     # a staging folder, now empty
        src.rmdir()


def _jsonable(value):
    """numpy scalars and paths in metrics: write them as plain numbers and strings."""
    if hasattr(value, "item"):
        return value.item()
    return str(value)


class FileLock:
    """An exclusive, non-blocking lock on `path` (released when the holder exits or dies):
    `with FileLock(p) as got:` - got is False when another process holds it. The `filelock`
    package does the locking (fcntl on POSIX, msvcrt on Windows), so kit imports everywhere."""

    def __init__(self, path: str | Path):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.lock = filelock.FileLock(str(path), thread_local=False)
        self.got = False

    def __enter__(self) -> bool:
        try:
            self.lock.acquire(blocking=False)
            self.got = True
        except filelock.Timeout:
            self.got = False
        return self.got

    def __exit__(self, *exc):
        if self.got:
            self.lock.release()
            self.got = False
