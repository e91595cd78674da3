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
Graphs change what a run computes (buckets, padded rows, another dropout stream), so `auto`
takes them only for the combinations a GPU run has verified (VERIFIED, `decide_graphs`), and a
run records what it resolved (`resolve_graphs`).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn

from kit.config.rules import guided

# cuda_graphs: auto's threshold. Measured on one H200 (bench/gpu.sh, BERT-base, bf16, SST-2,
# batch 32; docs/benchmarks.md): 20.2 steps/s eager, 65.3 with graphs, after 72 s of compilation
# on 16 host cores: break-even at ~2,100 steps. Twice that, for hosts that compile slower.
GRAPHS_MIN_STEPS = 4200


@dataclass(frozen=True)
class Verified:
    """A combination a GPU run has verified with CUDA graphs: `evidence` names the commit, the
    GPU and what was compared with the eager run of the same config."""
    method: str
    grad_accum: int
    processes: int
    evidence: str


# THE combinations `cuda_graphs: auto` may replay as graphs. A row needs a GPU run that trained it
# with graphs and eagerly and compared them (losses and dev scores with dropout on, a resume
# inside an epoch, two points in one warm kernel: bench/graphs_verify.py), not only their speed.
# Empty: the one GPU measurement (docs/gpu-runs/h200-2026-11-28: plain BERT at grad_accum 1 in one
# process, 65.3 steps/s with graphs against 20.2 eager) timed steps of random weights and compared
# no loss or score, and the CUDA test files run on that GPU were cut before their summary, with
# failures of unknown cause. Not verified either: SSA's heads, BERT-mask, grad_accum > 1 (a
# replayed backward can overwrite accumulated gradients: pytorch issues 169545, 96693), several
# processes. A row changes what `auto` computes: bump RESULTS_VERSION with it.
VERIFIED: tuple[Verified, ...] = ()


def verified(method: str, grad_accum: int, processes: int) -> Verified | None:
    """The VERIFIED row of this combination, or None."""
    return next((row for row in VERIFIED if (row.method, row.grad_accum, row.processes)
                 == (method, grad_accum, processes)), None)


def planned_steps(epochs: int, rows: int, batch_size: int, grad_accum: int = 1) -> int:
    """The optimizer steps of `rows` examples over `epochs` (what cuda_graphs: auto weighs;
    SSA's and BERT-mask's extra examples come on top)."""
    return epochs * -(-rows // (batch_size * grad_accum))


def decide_graphs(requested: str, device: str, steps: int | None, method: str,
                  grad_accum: int = 1, processes: int = 1, *, length_buckets: str = "auto",
                  guide_loss: str = "task", compile: bool = False) -> tuple[bool, str]:
    """(whether the encoder replays as CUDA graphs, why): `on` and `off` stand (on a CPU `on`
    is the same compilation with no graphs to replay); `auto` takes them only on a CUDA GPU,
    for a VERIFIED combination of method, grad_accum and processes, with length buckets not
    switched off, no attention maps (guiding's eager attention) or layer-wise compilation, and
    at least GRAPHS_MIN_STEPS planned `steps` (None: not counted yet). Pure: tests resolve a
    GPU's answer on any machine."""
    if requested != "auto":
        return requested == "on", f"cuda_graphs: {requested} was asked"
    if device != "cuda":
        return False, f"CUDA graphs need a CUDA GPU; this run trains on {device}"
    if length_buckets == "off":
        return False, "length_buckets: off was asked, and graphs replay one per length bucket"
    if guided(guide_loss) or compile:
        why = "attention guiding" if guided(guide_loss) else "compile: true"
        return False, f"{why} has not met the graphs on a GPU"
    row = verified(method, grad_accum, processes)
    if row is None:
        return False, (f"no GPU run has verified graphs for {method} at grad_accum {grad_accum} "
                       f"on {processes} process(es) (kit.models.regional_compile.VERIFIED)")
    if steps is None:
        return False, (f"graphs if its planned steps reach {GRAPHS_MIN_STEPS:,} (counted as it "
                       "starts)")
    if steps < GRAPHS_MIN_STEPS:
        return False, (f"{steps:,} planned steps, under the {GRAPHS_MIN_STEPS:,} that pay for "
                       "the compilation")
    return True, f"{steps:,} planned steps; verified: {row.evidence}"


@dataclass(frozen=True)
class Resolved:
    """What a run computes with: `cuda_graphs` and `length_buckets` as `on` / `off`, and why
    graphs are on or off (`resolve_graphs`)."""
    cuda_graphs: str
    length_buckets: str
    cuda_graphs_reason: str

    @property
    def graphs(self) -> bool:
        return self.cuda_graphs == "on"

    @property
    def record(self) -> dict:
        """What config.json's `resolved`, metrics.json and a checkpoint's hardware record hold."""
        return asdict(self)


def resolve_graphs(cfg, device: str, steps: int | None, processes: int) -> Resolved:
    """decide_graphs on the settings of a run of `cfg`, with the length buckets that follow:
    graphs replay one shape per bucket, so they bring buckets; `auto` buckets are off otherwise
    (kit.train.step.static_shape)."""
    on, why = decide_graphs(cfg.cuda_graphs, device, steps, cfg.method, cfg.grad_accum,
                            processes, length_buckets=cfg.length_buckets,
                            guide_loss=cfg.guide_loss, compile=cfg.compile)
    return Resolved("on" if on else "off", "on" if on or cfg.length_buckets == "on" else "off",
                    why)


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
