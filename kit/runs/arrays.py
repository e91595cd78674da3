"""Arrays a run writes and reads back - saved SSA labels (ssa_labels/epoch<N>.npz), a mid-epoch
checkpoint's epoch examples - as data, never code: an .npz of plain arrays plus a JSON header,
written atomically (kit.io) and loaded with pickling off. outputs/ may be a folder other people
write to; a pickle (torch.save, np.save of objects) runs whatever code it names when loaded, so
the kit refuses to read one back (`UnsafeFileError`, one line naming the file)."""
from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np

from kit.io import atomic_path, jsonable

ARRAYS_FORMAT = "kit-arrays/1"
HEADER = "kit-arrays.json"    # the npz member holding the JSON header; not an identifier, so
                              # no field's member can take its name


class UnsafeFileError(ValueError):
    """A file the kit reads back is not in the kit's array format (a pickle, a .pt file, an npz
    of objects, garbage): refused unread, since loading a pickle runs the code it names."""


def refused(path: str | Path, why: str, hint: str = "") -> UnsafeFileError:
    return UnsafeFileError(f"{path}: refused, not the kit's array format ({why}); the kit reads "
                           "back only .npz data written by kit.runs.arrays.write_arrays, never a pickle, "
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
    members[HEADER] = np.array(json.dumps(header, default=jsonable))
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
