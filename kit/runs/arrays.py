"""Arrays a run writes and reads back - saved SSA labels (ssa_labels/epoch<N>.safetensors), a
mid-epoch checkpoint's epoch examples - as data, never code: a safetensors file (raw tensors and
a JSON header, which cannot hold a pickle) written atomically (kit.io). outputs/ may be a folder
other people write to; a pickle (torch.save, np.save of objects) runs whatever code it names when
loaded, so anything else is refused unread (`UnsafeFileError`, one line naming the file); the
.npz files of kit-arrays/1 (older kits) too, with the way to regenerate them."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from kit.io import atomic_path, jsonable

ARRAYS_FORMAT = "kit-arrays/2"
HEADER = "kit-arrays"          # the safetensors metadata key holding the JSON header
ZIP_MAGIC = b"PK"              # an .npz (kit-arrays/1) or torch.save file: a zip archive


class UnsafeFileError(ValueError):
    """A file the kit reads back is not in the kit's array format (a pickle, a .pt file, an npz
    of objects, garbage): refused, unread, since loading a pickle runs the code it names."""


def refused(path: str | Path, why: str, hint: str = "") -> UnsafeFileError:
    return UnsafeFileError(f"{path}: refused, not the kit's array format ({why}); the kit reads "
                           "back only safetensors data written by kit.runs.arrays.write_arrays, "
                           f"never a pickle, which can run code{hint}")


def write_arrays(path: str | Path, arrays: dict[str, np.ndarray | list[np.ndarray] | None],
                 meta: dict) -> None:
    """Write `arrays` and `meta` atomically as one safetensors file that `read_arrays` reads back
    exactly.

    A value is an array (any shape, any dtype but object), a ragged list of 1-D arrays of one
    dtype (stored as its concatenated values and int64 offsets: one np.concatenate however many
    rows) or None. `meta` is JSON (numpy scalars become numbers); it, the fields' kinds and each
    member's dtype and shape go into the file's JSON header. A dtype safetensors lacks (text,
    big-endian numbers) is stored as its raw bytes and viewed back."""
    members, kinds = {}, {}
    for name, value in arrays.items():
        if not (isinstance(name, str) and name.isidentifier()):
            raise ValueError(f"{path}: array name {name!r} is not an identifier")
        kinds[name] = _pack(path, name, value, members)
    header = {"format": ARRAYS_FORMAT, "fields": kinds, "meta": meta,
              "members": {k: [v.dtype.str, list(v.shape)] for k, v in members.items()}}
    stored = {k: v if v.dtype.kind in "biuf" and v.dtype.isnative
              else np.frombuffer(v.tobytes(), np.uint8) for k, v in members.items()}
    with atomic_path(path) as tmp:
        save_file(stored, str(tmp), metadata={HEADER: json.dumps(header, default=jsonable)})


def _pack(path, name: str, value, members: dict) -> str:
    """Put one field's members into `members`; its kind for the header."""
    if value is None:
        return "none"
    if isinstance(value, np.ndarray):
        _storable(path, name, value.dtype)
        members[name] = np.require(value, requirements="C")     # 0-d stays 0-d
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
    offsets = np.concatenate([np.zeros(1, np.int64), np.cumsum([len(r) for r in rows],
                                                               dtype=np.int64)])
    if not dtypes:
        return np.zeros(0, np.uint8), offsets
    dtype = dtypes.pop()
    _storable(path, name, dtype)
    # dtype= keeps it exactly: without it concatenate turns big-endian rows native
    return np.concatenate(rows, dtype=dtype), offsets


def _storable(path, name: str, dtype: np.dtype) -> None:
    if dtype.hasobject:   # no bytes to store: the objects would need a pickle
        raise ValueError(f"{path}: {name} holds Python objects (dtype {dtype}); store numbers, "
                         "booleans or strings")


def read_arrays(path: str | Path) -> tuple[dict, dict]:
    """(arrays, meta) of a file `write_arrays` wrote: the same names in the same order, arrays
    with their dtypes and shapes, ragged fields as lists of 1-D arrays (views of one buffer),
    None fields as None; meta as JSON gives it back. Anything else - a pickle, a .pt file, an
    older kit's .npz, a safetensors file without the kit's header - raises UnsafeFileError,
    unloaded (a missing file raises FileNotFoundError)."""
    with open(path, "rb") as f:
        if f.read(2) == ZIP_MAGIC:
            raise refused(path, "a zip archive: an older kit's .npz (kit-arrays/1) or a torch.save "
                          "file", hint="; regenerate it with this kit")
    try:
        with safe_open(str(path), "np") as f:
            header = json.loads((f.metadata() or {}).get(HEADER, "null"))
            if not isinstance(header, dict) or header.get("format") != ARRAYS_FORMAT:
                raise ValueError(f"no {ARRAYS_FORMAT} header")
            members = {k: _member(f, k, *spec) for k, spec in header["members"].items()}
        return _unpack(header, members), header["meta"]
    except (SafetensorError, ValueError, KeyError, TypeError) as err:
        text = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise refused(path, "not safetensors data" if isinstance(err, SafetensorError)
                      else text) from None


def _member(f, key: str, dtype: str, shape: list) -> np.ndarray:
    """One member with the dtype and shape the header gives it (raw bytes viewed back)."""
    wanted, value = np.dtype(dtype), f.get_tensor(key)
    if wanted.hasobject:
        raise ValueError(f"member {key} claims Python objects")
    if value.dtype != wanted:
        value = value.view(wanted)
    return value.reshape(shape)


def _unpack(header: dict, members: dict) -> dict:
    arrays = {}
    for name, kind in header["fields"].items():
        if kind == "none":
            arrays[name] = None
        elif kind == "array":
            arrays[name] = members[name]
        elif kind == "ragged":
            arrays[name] = _rows(members[f"{name}.values"], members[f"{name}.offsets"])
        else:
            raise ValueError(f"unknown kind {kind!r} of field {name}")
    return arrays


def _rows(values: np.ndarray, offsets: np.ndarray) -> list[np.ndarray]:
    """The ragged list back: slices of one buffer (a loop of slices; np.split's per-row
    swapaxes makes it ~4x slower on 400k rows)."""
    if (values.ndim != 1 or offsets.ndim != 1 or offsets.dtype.kind != "i" or not len(offsets)
            or offsets[0] != 0 or offsets[-1] != len(values) or (np.diff(offsets) < 0).any()):
        raise ValueError("ragged offsets do not match their values")
    bounds = offsets.tolist()
    return [values[start:end] for start, end in zip(bounds[:-1], bounds[1:])]
