"""Atomic writes: a file a later step reads is either complete or absent, never half-written."""
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
        os.replace(tmp, path)
    except OSError as err:
        if err.errno == errno.ENOSPC:
            raise OutputsError(f"disk full while writing {path}; free space and rerun "
                               "(finished runs are kept, this one resumes)") from None
        raise
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def write_text(path: str | Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def write_json(path: str | Path, obj) -> None:
    write_text(path, json.dumps(obj, indent=2, default=_jsonable) + "\n")


def atomic_torch_save(obj, path: str | Path) -> None:
    import torch
    with atomic_path(path) as tmp:
        torch.save(obj, tmp)


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
        if path.exists():
            path.rename(old)
        tmp.rename(path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)


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
