"""Atomic writes: a file a later step reads is either complete or absent, never half-written.

Written beside, flushed to disk (fsync), renamed over the name, the folder flushed: a killed
process or a crashed node leaves the old file or the new one (unflushed, a rename may reach the
disk before the data: an empty file under the real name on ext4, XFS, Lustre).

Arrays (saved SSA labels, a checkpoint's epoch examples) have their own format:
kit.runs.arrays.
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

import filelock


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
    write_text(path, json.dumps(obj, indent=2, default=jsonable) + "\n")


@contextmanager
def atomic_dir(path: str | Path):
    """Yield a temporary folder beside `path` to fill; on success it replaces `path` (a
    reader sees the old folder or the new one, never a half-written one), on error it is
    removed."""
    tmp = _dir_beside(Path(path))
    old = tmp.with_suffix(".old")
    try:
        yield tmp
        swap_in(tmp, Path(path), old)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)


@contextmanager
def files_into(path: str | Path):
    """Yield a temporary folder beside `path` to fill with new files; on success they join
    `path`, on an error while filling none does. An absent `path` becomes the filled folder (one
    rename); else each file is moved in (os.replace) once all are written - a failure between
    two of those renames leaves the files moved so far, each whole - and the files `path` holds
    under other names are never touched."""
    path = Path(path)
    tmp = _dir_beside(path)
    try:
        yield tmp
        fsync_tree(tmp)
        if path.exists():
            for new in sorted(tmp.iterdir()):
                os.replace(new, path / new.name)
            fsync(path, folder=True)
        else:
            os.rename(tmp, path)
        fsync(path.parent, folder=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _dir_beside(path: Path) -> Path:
    """A new hidden temporary folder beside `path` (one file system: renames are atomic)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
    os.chmod(tmp, 0o777 & ~_umask())   # mkdtemp makes 0700; results are meant to be shared
    return tmp


def swap_in(tmp: Path, path: Path, old: Path) -> None:
    """Replace `path` by the filled folder `tmp`, keeping the previous copy as `old` until the
    new one is in place. The new files reach the disk before the renames, and the renames
    before the old copy goes: after a crash `path` is the old folder or the new one (or, between
    the renames, only `old` is whole), never a name over data that was still in memory."""
    fsync_tree(tmp)
    if path.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.rename(path, old)
    os.rename(tmp, path)
    fsync(path.parent, folder=True)
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


def jsonable(value):
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
