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

CUDA graphs (`capture_graphs`, RunConfig.cuda_graphs): the whole encoder compiled with mode
"reduce-overhead", so each length bucket's forward and backward replay as one CUDA graph each
(~1,400 kernel launches a step become a few; dropout's random numbers are drawn inside the
graph from inductor's philox seeds). Shapes dynamic from the start: the encoder compiles once
per mode (training, evaluation) and cudagraph trees record one graph per bucket shape.
"""
from __future__ import annotations

import torch
from torch import nn

# cuda_graphs: auto's threshold. Measured on one H200 (bench/gpu.sh, BERT-base, bf16, SST-2,
# batch 32; docs/benchmarks.md): 20.2 steps/s eager, 65.3 with graphs, after 72 s of compilation
# on 16 host cores: break-even at ~2,100 steps. Twice that, for hosts that compile slower.
GRAPHS_MIN_STEPS = 4200


def planned_steps(epochs: int, rows: int, batch_size: int, grad_accum: int = 1) -> int:
    """The optimizer steps of `rows` examples over `epochs` (what cuda_graphs: auto weighs;
    SSA's and BERT-mask's extra examples come on top)."""
    return epochs * -(-rows // (batch_size * grad_accum))


def resolve_cuda_graphs(requested: str, device: str, steps: int, eligible: bool) -> bool:
    """What `cuda_graphs` means: `on` compiles the encoder with CUDA graphs (kit.models.
    regional_compile.capture_graphs; on a CPU the same compilation, with no graphs to replay).
    `auto`: on where a GPU measured it faster - a CUDA run of at least GRAPHS_MIN_STEPS `steps`
    that is `eligible`: its encoder returns no attention maps (attention guiding's eager
    attention has not met the graphs on a GPU) and is not compiled layer-wise - else off."""
    if requested != "auto":
        return requested == "on"
    return device == "cuda" and eligible and steps >= GRAPHS_MIN_STEPS


# torch.compile's backend for capture_graphs (tests on a CPU set "aot_eager": the same graph
# capture without inductor's minutes of code generation)
GRAPH_BACKEND = "inductor"


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


def capture_graphs(model: nn.Module) -> nn.Module:
    """Compile, in place, `model`'s encoder (its `backbone`, else the model) with mode
    reduce-overhead: on CUDA, inductor replays each shape as a CUDA graph; elsewhere it is a
    plain compilation (inductor skips graphs off CUDA). The compiled function replaces the
    encoder's `forward` on the instance: its parameters, state-dict names and checkpoints stay
    as they were. Returns the encoder."""
    target = getattr(model, "backbone", model)
    mode = "reduce-overhead" if GRAPH_BACKEND == "inductor" else None
    compiled = torch.compile(target.forward, backend=GRAPH_BACKEND, mode=mode, dynamic=True)

    def forward(*args, **kwargs):
        # each call of the encoder is a new step for cudagraph trees (one forward per training
        # step, one per evaluation batch): the previous replay's outputs, already used, may be
        # overwritten. Marked outside the compiled function, so no graph breaks on it
        torch.compiler.cudagraph_mark_step_begin()
        return compiled(*args, **kwargs)

    target.forward = forward
    return target
