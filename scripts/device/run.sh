#!/usr/bin/env bash
# On the GPU machine, from the repository root, with .cache/device carried (made here by
# scripts/device/prepare.sh): builds nothing of redlite. In order:
#   1. llama.cpp (CUDA, sm_90) from the carried sources, in the background (~5 min);
#   2. the full-size synthetic files (IQ2_XXS, and IQ1_M unless QUICK=1);
#   3. parity: the kernel tests, the CUDA parity tests (also with the token-tiled prefill
#      kernel), and `redlite serve` on the GPU: 8 concurrent greedy streams against the same
#      requests alone, with the decode graph and without;
#   4. benches: redlite alone (A/B switches), then scripts/bench/vs-llamacpp-cuda.sh (both,
#      alternating) unless QUICK=1;
#   5. a short table last. Full logs in $OUT/logs.tgz, the table in $OUT/summary.txt.
#
#   bash scripts/device/run.sh            # QUICK=1: no llama.cpp, no IQ1_M
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
D="$ROOT/.cache/device"; W=/tmp/rl; QUICK="${QUICK:-0}"
RESULTS="${OUT:-$W/results}"; OUT="$W/logs"  # the bench script writes its logs to $OUT too
mkdir -p "$W" "$OUT" "$RESULTS" "$ROOT/target/release"
cp "$D/redlite" "$ROOT/target/release/redlite"
R="$ROOT/target/release/redlite"; S="$ROOT/scripts/bench/vs-llamacpp-cuda.sh"
export LD_LIBRARY_PATH="/usr/local/cuda-13.0/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}"
SUMMARY="$OUT/summary.txt"; : > "$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }
stamp() { echo "[$SECONDS s] $*"; }

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$SUMMARY"
[ "$QUICK" = 1 ] || bash "$S" build
F="$W/full-IQ2_XXS.gguf"
RECIPE=IQ2_XXS bash "$S" synth
[ "$QUICK" = 1 ] || RECIPE=IQ1_M bash "$S" synth

stamp "kernel tests"
"$D/kernels" --test-threads=1 > "$OUT/kernels.log" 2>&1
note "kernels: $(grep -E '^test result' "$OUT/kernels.log" | tail -1)"
REDLITE_PREFILL_TILES=1 "$D/kernels" --test-threads=1 matmul > "$OUT/kernels-tiles.log" 2>&1
note "kernels, token tiles: $(grep -E '^test result' "$OUT/kernels-tiles.log" | tail -1)"

stamp "parity tests"
"$D/cuda_parity" --test-threads=1 --nocapture > "$OUT/parity.log" 2>&1
note "cuda_parity: $(grep -E '^test result' "$OUT/parity.log" | tail -1)"
note "  worst exact: $(grep -h 'Exact' "$OUT/parity.log" | sort -k8 -g | tail -1)"
note "  worst q8:    $(grep -h 'Ggml' "$OUT/parity.log" | sort -k8 -g | tail -1)"
REDLITE_PREFILL_TILES=1 "$D/cuda_parity" --test-threads=1 --nocapture > "$OUT/parity-tiles.log" 2>&1
note "cuda_parity, token tiles: $(grep -E '^test result' "$OUT/parity-tiles.log" | tail -1)"

serve_check() {
  local name="$1"; shift
  env "$@" "$R" serve -m "$F" --device cuda --slots 4 --snapshots 0 --ctx 2048 --port 18080 \
    > "$OUT/serve-$name.log" 2>&1 &
  local pid=$!
  for _ in $(seq 180); do curl -sf http://127.0.0.1:18080/health > /dev/null && break; sleep 1; done
  timeout 120 python3 "$ROOT/scripts/device/serve_smoke.py" http://127.0.0.1:18080 8 32 \
    > "$OUT/serve-$name.txt" 2>&1
  kill -INT "$pid"; wait "$pid"
  note "serve ($name): $(grep -E 'equal to the request alone' "$OUT/serve-$name.txt")"
}
stamp "serve"
serve_check graph REDLITE_UNUSED=0
serve_check no-graph REDLITE_CUDA_GRAPH=0

stamp "redlite A/B"
tg() {
  env "$@" "$R" bench -m "$F" --device cuda -p 512 -n 128 -d 0 -r 2 2>&1 | grep -E '^\| (pp|tg)' \
    | tr -s ' ' | tr '\n' ' '
}
note "defaults:               $(tg REDLITE_UNUSED=0)"
note "token-tiled prefill:    $(tg REDLITE_PREFILL_TILES=1)"
note "exact (f32 activations): $(tg REDLITE_CUDA_EXACT=1)"

if [ "$QUICK" != 1 ]; then
  stamp "same-run comparison"
  RECIPE=IQ2_XXS ROUNDS=1 bash "$S" bench > "$OUT/vs-IQ2_XXS.txt" 2>&1
  RECIPE=IQ1_M ROUNDS=1 DEPTHS=0 OUT="$OUT/iq1m" bash "$S" bench > "$OUT/vs-IQ1_M.txt" 2>&1
  note ""; note "IQ2_XXS, llama.cpp and redlite in the same run:"; grep -E '^\|' "$OUT/vs-IQ2_XXS.txt" | tee -a "$SUMMARY"
  note ""; note "IQ1_M:"; grep -E '^\|' "$OUT/vs-IQ1_M.txt" | tee -a "$SUMMARY"
fi
stamp "done"
cp "$SUMMARY" "$RESULTS/summary.txt"
tar czf "$RESULTS/logs.tgz" -C "$OUT" .
echo; echo "== summary"; cat "$SUMMARY"
