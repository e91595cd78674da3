#!/usr/bin/env bash
# The GPU benchmark in one command, under 8 minutes on one GPU (bench/gpu_bench.py: a total
# budget of 420 s, each contender and grid run tried on its own, its error recorded): the kit
# now, with length_buckets, and at commit a274152 (a git worktree, before and after on one card
# in one run), against the Trainer (grouped bf16; torch_compile reduce-overhead), then a grid of
# SST-2 and RTE points with --per-device 1, 2, 4 and a PROJECTION of params/paper-base.yaml.
# Offline: a BERT-base built from its config with random weights (only the embedded vocabulary).
#   bench/gpu.sh                        # results.json + results.md in $OUT, else outputs/bench/gpu-DATE
#   bench/gpu.sh --cpu-smoke            # the same Python path on a CPU, tiny model, few steps
#   bench/gpu.sh --contenders kit,kit-old --grid-k 1,2
# Set-up on an offline GPU node whose Python has torch, transformers and accelerate: docs/gpu.md
# ("The GPU benchmark on a lent machine": pip download the rest on a networked machine).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
OUT=${OUT:-outputs/bench/gpu-$(date +%Y%m%d-%H%M%S)}
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
case " $* " in
  *" --cpu-smoke "*) ;;
  *) "$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device visible to torch (--cpu-smoke runs on a CPU)'" || exit 2 ;;
esac
exec "$PY" bench/gpu_bench.py --out "$OUT" "$@"
