#!/usr/bin/env bash
# The GPU benchmark in one command (a CUDA torch in .venv, no network needed; GLUE from data/glue):
# a BERT-base-sized model built from its config with random weights, SST-2, bf16 autocast.
#   bench/gpu.sh                                   # writes outputs/bench/gpu-*.json
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
ROWS=${ROWS:-10000}
"$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device visible to torch'"
"$PY" bench/trainer_vs_kit.py --model bert-base-random --task SST-2 --max-train "$ROWS" \
    --epochs 1 --rounds 3 --contenders kit,trainer-grouped --json outputs/bench/gpu-trainer_vs_kit.json
# (the first round of a fresh machine is warm-up for both: docs/benchmarks.md, "The GPU path")
"$PY" bench/ssa_cost.py --model bert-base-random --task SST-2 --max-train "$ROWS" --epochs 2 \
    --gammas 1.0 --methods bert,ssa-h --json outputs/bench/gpu-ssa_cost.json
