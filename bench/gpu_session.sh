#!/usr/bin/env bash
# One call on a GPU machine lent for a few minutes, in the order that matters (docs/gpu.md):
#   1. the kit's missing dependencies from carried wheels (WHEELS=folder; none: skipped);
#   2. the CUDA-relevant tests (tests.log), each failure's test id and traceback appended to
#      failures.txt as it fails (bench/failure_log.py), a test cut at TEST_S when pytest-timeout
#      is installed;
#   3. bench/graphs_verify.py: CUDA graphs against eager on paper-base's methods (METHODS), the
#      evidence a row of kit.models.regional_compile.VERIFIED needs (graphs/results.md);
#   4. bench/gpu.sh with what has not been measured yet (CONTENDERS, GRID_K; OLD_KIT=folder of
#      the project at a274152 adds kit-old);
#   5. ./run_all.sh plan paper-base (plan.json, plan.txt), HF_HOME holding bert-base-uncased's
#      config and tokenizer.
# Each step has its own time cap (TESTS_S, GRAPHS_S, BENCH_S, PLAN_S), so one that hangs leaves
# the others their time; a cap of 0 skips its step (two calls can share the steps out).
# Everything lands in $OUT. --cpu-smoke: the same steps on a CPU, tiny budgets.
#   OUT=/tmp/out WHEELS=.gpu/wheels bench/gpu_session.sh
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
OUT=${OUT:-outputs/bench/gpu-session-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
T0=$(date +%s)
say() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a "$OUT/session.log"; }
SMOKE=""; [ "${1:-}" = "--cpu-smoke" ] && SMOKE=1
if [ -n "${WHEELS:-}" ]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/gpu-site "$WHEELS"/*.whl \
    > "$OUT/pip.log" 2>&1 || say "wheel install failed: $OUT/pip.log"
  export PYTHONPATH="$PWD:/tmp/gpu-site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
"$PY" -c "import torch, transformers, accelerate; print('torch', torch.__version__, 'cuda',
torch.version.cuda, torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU',
'transformers', transformers.__version__, 'accelerate', accelerate.__version__)" \
  | tee -a "$OUT/session.log"

TESTS="tests/test_sync_free.py tests/test_precision.py tests/test_preemption.py
       tests/test_per_device.py tests/test_cuda_graphs.py"
[ -n "$SMOKE" ] && TESTS="tests/test_cuda_graphs.py"
# -o addopts= drops the project's -q (which cancels -vv): each outcome on its line as it comes;
# -rfE every failure's reason in the summary, which SIGINT at the cap still prints (SIGKILL
# 30 s later); failures.txt has them from the moment each test fails, with the traceback
# --tb sets (line: the error alone)
if [ "${TESTS_S:-150}" != 0 ]; then
  PER_TEST=()
  "$PY" -c "import pytest_timeout" 2>/dev/null && PER_TEST=(--timeout "${TEST_S:-120}")
  timeout -s INT -k 30 "${TESTS_S:-150}" "$PY" -m pytest -o addopts= -p no:cacheprovider \
    -p bench.failure_log --failure-log "$OUT/failures.txt" "${PER_TEST[@]}" -vv -rfE --tb=short \
    -n "${WORKERS:-8}" $TESTS > "$OUT/tests.log" 2>&1
  say "tests exit $?: $(grep -cE ' PASSED' "$OUT/tests.log") passed, $(grep -cE ' FAILED| ERROR' "$OUT/tests.log") failed"
  grep -E "^(FAILED|ERROR) " "$OUT/tests.log" | cut -c1-300 | tee -a "$OUT/session.log"
  [ -s "$OUT/failures.txt" ] && say "tracebacks: $OUT/failures.txt"
fi

if [ "${GRAPHS_S:-300}" != 0 ]; then
  # no check starts in its last 60 s: one graphed run (compilation included) fits in them
  GRAPHS=(--budget-s "$(( ${GRAPHS_S:-300} - 60 ))" ${METHODS:+--methods "$METHODS"})
  [ -n "$SMOKE" ] && GRAPHS=(--cpu-smoke --methods bert --budget-s 60)
  timeout -k 5 "${GRAPHS_S:-300}" "$PY" bench/graphs_verify.py --out "$OUT/graphs" "${GRAPHS[@]}" \
    > "$OUT/graphs.log" 2>&1
  say "graphs exit $?: $OUT/graphs (results.md, results.json)"
fi

if [ "${BENCH_S:-230}" != 0 ]; then
  BENCH=(--contenders "${CONTENDERS:-kit,kit-graphs,trainer-grouped,trainer-compiled}"
         --grid-k "${GRID_K:-1,4}" --rounds 1 --budget-s "${BUDGET_S:-200}")
  [ -n "${OLD_KIT:-}" ] && BENCH+=(--old-kit "$OLD_KIT") && BENCH[1]="${BENCH[1]},kit-old"
  [ -n "$SMOKE" ] && BENCH=(--cpu-smoke --contenders kit --grid-k 1 --rounds 1 --budget-s 60)
  PY="$PY" OUT="$OUT/bench" timeout -k 5 "${BENCH_S:-230}" bench/gpu.sh "${BENCH[@]}" \
    > "$OUT/bench.log" 2>&1
  say "bench exit $?: $OUT/bench (results.md, contenders.json)"
fi

if [ "${PLAN_S:-150}" != 0 ]; then
  PROFILE=paper-base; ONLY=()
  [ -n "$SMOKE" ] && PROFILE=smoke && ONLY=(--only method=bert)
  timeout -k 5 "${PLAN_S:-150}" "$PY" -m kit.plan "$PROFILE" "${ONLY[@]}" --json --budget 2 \
    > "$OUT/plan.json" 2> "$OUT/plan.log"
  say "plan exit $?"
  "$PY" -c "import json, sys; from pathlib import Path; from kit import plan
print(plan.render(json.load(open(sys.argv[1])), Path('outputs')))" "$OUT/plan.json" \
    > "$OUT/plan.txt" 2>&1 && tail -4 "$OUT/plan.txt" | tee -a "$OUT/session.log"
fi
say "done"
