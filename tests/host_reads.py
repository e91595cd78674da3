"""HostReads: a counter of host reads, the calls that bring a device value to the host and so,
on a GPU, wait for every kernel queued before them (tests/test_sync_free.py).

A TorchFunctionMode sees every tensor method and torch function called from Python (the kit's,
transformers' and accelerate's code alike); the counter records the reading ones. On a CPU they
cost nothing, which is why they are counted rather than timed: the same count holds on a GPU.
"""
import weakref

import torch
from torch.overrides import TorchFunctionMode

# tensor methods and torch functions whose result is a host value read from the tensor
READS = {"item", "tolist", "cpu", "numpy", "__array__", "nonzero", "argwhere", "masked_select",
         "unique", "unique_consecutive", "__bool__", "__float__", "__int__", "__index__",
         "__format__", "__repr__", "is_nonzero", "equal", "allclose", "repeat_interleave"}


def _to_host(args, kwargs) -> bool:
    """`.to("cpu")`: code bringing a tensor to the host. `.to(device)` with a torch.device is
    code moving it to the run's device (clip_grad_norm_, module.to, the batch copy), the CPU
    here and a GPU there: not counted, as it cannot be told apart on this machine."""
    targets = list(args[1:]) + [kwargs.get("device")]
    return any(t == "cpu" for t in targets if isinstance(t, str))


def _bool_index(index) -> bool:
    parts = index if isinstance(index, tuple) else (index,)
    return any(isinstance(p, torch.Tensor) and p.dtype == torch.bool for p in parts)


class HostReads(TorchFunctionMode):
    """Records each host read as ("read", name) and each mark(label) as ("mark", label), in
    order. A tensor a read returned (`.cpu()`) is host memory: reading it again is no second
    read."""

    def __init__(self):
        super().__init__()
        self.events: list[tuple] = []
        self.host: dict[int, weakref.ref] = {}     # id -> the tensor (a set would compare them)

    def mark(self, label: str) -> None:
        self.events.append(("mark", label))

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        out = func(*args, **kwargs)
        first = args[0] if args else None
        reads = (name in READS or (name == "to" and _to_host(args, kwargs))
                 or (name in ("__getitem__", "__setitem__") and len(args) > 1
                     and _bool_index(args[1])))
        if reads and not self._on_host(first):
            self.events.append(("read", name))
            if isinstance(out, torch.Tensor) and name in ("cpu", "to"):
                self.host[id(out)] = weakref.ref(out)
        elif name in ("cat", "stack") and args and all(self._on_host(t) for t in args[0]):
            self.host[id(out)] = weakref.ref(out)          # host tensors joined on the host
        return out

    def _on_host(self, tensor) -> bool:
        known = self.host.get(id(tensor))
        return known is not None and known() is tensor

    def segments(self) -> list[tuple[str, list[str]]]:
        """(mark, the reads after it up to the next mark) for every mark, in order."""
        out = []
        for kind, label in self.events:
            if kind == "mark":
                out.append((label, []))
            elif out:
                out[-1][1].append(label)
        return out


def summary(counter: HostReads, window_end: list[bool]) -> dict[str, list[int]]:
    """Reads per ordinary step, per step that ends a logging window, per batch of an inference
    pass but its last, per last batch (with the end of its pass)."""
    seen = {"step": [], "window": [], "batch": [], "last batch": []}
    segments = counter.segments()
    steps = iter(window_end)
    for i, (label, reads) in enumerate(segments):
        if label == "step":
            seen["window" if next(steps) else "step"].append(len(reads))
        elif label == "batch":
            last = i + 1 < len(segments) and segments[i + 1][0] == "end"
            extra = len(segments[i + 1][1]) if last else 0
            seen["last batch" if last else "batch"].append(len(reads) + extra)
    return seen
