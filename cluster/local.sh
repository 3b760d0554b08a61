#!/usr/bin/env bash
# Local workflow for sembridge_ray (see cluster/README.md).
#
#   bash cluster/local.sh test [pytest args]   set up .venv, run the default pytest selection (exit code = pytest's)
#   bash cluster/local.sh demo [job args]      set up .venv, start a loopback Ray head unless RAY_ADDRESS is set,
#                                              submit the demo with `ray job submit`, print its result
#   bash cluster/local.sh setup                only create or refresh .venv
#
# Environment: PYTHON (interpreter for the venv, >= 3.11), DEMO_OUTPUT (default outputs/demo),
# RAY_ADDRESS (submit to that cluster instead of a local head), HF_HUB_OFFLINE (default 1 here: nothing is fetched).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PYTHON="${PYTHON:-python3}"
cd "$ROOT"
export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}" HF_HUB_DISABLE_PROGRESS_BARS=1 TOKENIZERS_PARALLELISM=false
export RAY_USAGE_STATS_ENABLED=0 PIP_DISABLE_PIP_VERSION_CHECK=1

torch_spec() {
  # Without a CUDA GPU, pin the CPU build: an unpinned torch resolves to a multi-GB CUDA wheel.
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo "torch>=2.5,<2.15"
  else
    echo "torch==2.13.0"
  fi
}

setup() {
  "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
    || { echo "error: $PYTHON is older than Python 3.11" >&2; exit 2; }
  [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
  local spec stamp want
  spec="$(torch_spec)"
  stamp="$VENV/.sembridge-installed"
  want="$(cat pyproject.toml | sha256sum | cut -d' ' -f1) $spec"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && "$VENV/bin/python" -c 'import sembridge_ray' 2>/dev/null; then
    echo "[local.sh] .venv is up to date"
    return
  fi
  echo "[local.sh] installing sembridge-ray[dev] with $spec into .venv"
  local start=$SECONDS
  "$VENV/bin/python" -m pip install -q "$spec" -e ".[dev]" 2>&1 | grep -v "location is ignored" || true
  "$VENV/bin/python" -c 'import sembridge_ray, torch, ray' \
    || { echo "error: installation into $VENV failed" >&2; exit 1; }
  echo "$want" > "$stamp"
  echo "[local.sh] installed in $((SECONDS - start)) s"
}

run_tests() {
  setup
  exec "$VENV/bin/python" -m pytest "$@"
}

run_demo() {
  setup
  export PATH="$VENV/bin:$PATH"   # the job's `python` is the head's: this venv
  local dash="${RAY_DASHBOARD_PORT:-8265}"
  if [ -z "${RAY_ADDRESS:-}" ]; then
    # Loopback only: Ray would resolve 127.0.0.1 to the external interface without the first variable.
    export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 RAY_AUTH_MODE="${RAY_AUTH_MODE:-disabled}"
    if ray status --address 127.0.0.1:6379 >/dev/null 2>&1; then
      echo "[local.sh] reusing the local Ray head at 127.0.0.1:6379"
    else
      ray start --head --node-ip-address=127.0.0.1 --dashboard-host=127.0.0.1 --port=6379 \
        --dashboard-port="$dash" --disable-usage-stats >/dev/null
      trap 'echo "[local.sh] stopping the local Ray head"; ray stop >/dev/null 2>&1 || true' EXIT
    fi
    export RAY_ADDRESS="http://127.0.0.1:$dash"
  fi
  local out="${DEMO_OUTPUT:-outputs/demo}"
  case "$out" in /*) ;; *) out="$ROOT/$out" ;; esac   # the job runs in a copy of the working dir
  echo "[local.sh] submitting the demo to $RAY_ADDRESS (output: $out)"
  ray job submit --address "$RAY_ADDRESS" --runtime-env cluster/runtime_env.yaml --working-dir . \
    -- python -m jobs.demo --output "$out" "$@"
  [ -f "$out/results.csv" ] || { echo "error: the demo job wrote no results ($out/results.csv missing)" >&2; exit 1; }
  echo "[local.sh] demo complete: $out"
  [ -f "$out/results.md" ] && cat "$out/results.md"
}

case "${1:-}" in
  test) shift; run_tests "$@" ;;
  demo) shift; run_demo "$@" ;;
  setup) setup ;;
  *) echo "usage: bash cluster/local.sh {test|demo|setup} [args]" >&2; exit 2 ;;
esac
