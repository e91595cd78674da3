"""Regional compilation: torch.compile the encoder's repeated layer, not the whole model.

Why: a whole-model `torch.compile` on a CPU took ~160 s to compile and ran no faster
(docs/benchmarks.md). The encoder's layers share one class and one `forward`, and torch traces
parameters as inputs, so compiling each layer in place compiles that code once per input shape
and every layer reuses it - as transformers and torchtune do. What inductor gains inside the
layer is fused element-wise work (dropout with in-kernel random numbers, residual adds,
LayerNorm, GELU, the casts around them); the matmuls stay the same library calls.
Shapes: torch's automatic dynamic by default - the first shape compiles static, a second
shape recompiles once with symbolic sizes that then serve every length of a length-grouped run;
`dynamic=False` compiles each shape (a benchmark's fixed batch).
"""
from __future__ import annotations

from torch import nn


def repeated_layers(model: nn.Module) -> nn.ModuleList | None:
    """The longest nn.ModuleList of `model` whose modules are all of one class (a transformer's
    layers), or None."""
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList) and len(m) > 1
             and len({type(layer) for layer in m}) == 1]
    return max(lists, key=len, default=None)


def compile_layers(model: nn.Module, dynamic: bool | None = None,
                   backend: str = "inductor") -> int:
    """Compile, in place, every layer of `model`'s repeated block (Module.compile keeps the
    module, its parameters and state-dict names) with torch.compile's `backend`. Returns how
    many layers were compiled."""
    layers = repeated_layers(model) or ()
    for layer in layers:
        layer.compile(dynamic=dynamic, backend=backend)
    return len(layers)
