#!/usr/bin/env bash
# On the GPU machine, one call for off-by-default options that keep the math, then issue 6's
# matrix with them where they won. Carry .cache/device/redlite.xz, routing and llama-src.tgz
# (scripts/device/prepare.sh); an estimated 7-8 minutes on an H200 (not yet run there), most of
# it llama.cpp's build (started first, niced, in the background while the files are written and
# the options measured):
#   1. bits: `redlite logits --chunk 1` over 2,100 tokens (past the attention's split length) with
#      the defaults and with OPTS all set, compared byte for byte; the routing GPU tests with OPTS;
#   2. ab_rounds.sh with f32 KV at depth 4096, two rounds, the defaults against OPTS;
#   3. vs-llamacpp-cuda.sh on both recipes with f32 KV (MROUNDS rounds, 2), with OPTS set only
#      when their bits matched and their rounds gained more than 0.1 %; then f16 KV, one round, if
#      the call is younger than F16_BEFORE seconds (420).
# LEAN=1: none of step 3 (no llama.cpp, no IQ1_M file); f16 rounds at depths 0 and 4096 instead.
#
#   OPTS="REDLITE_NORM_SUM_TREE=1 REDLITE_ROUTE_GATE_TAIL=1" bash scripts/device/options_then_matrix.sh
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# shellcheck source=scripts/device/common.sh
source "$ROOT/scripts/device/common.sh"
R="$ROOT/target/release/redlite"; unpack "$D/redlite.xz" "$R"
VS="$ROOT/scripts/bench/vs-llamacpp-cuda.sh"
OPTS="${OPTS:-REDLITE_ATTN_ROWS_AHEAD=2 REDLITE_NORM_SUM_TREE=1 REDLITE_ROUTE_GATE_TAIL=1}"
LEAN="${LEAN:-0}"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$SUMMARY"
stamp "start; options: $OPTS"
[ "$LEAN" = 1 ] || nice -n 19 bash "$VS" build
recipes="IQ2_XXS IQ1_M"; [ "$LEAN" = 1 ] && recipes=IQ2_XXS
for r in $recipes; do RECIPE=$r bash "$VS" synth | tee -a "$SUMMARY"; done
M="$W/full-IQ2_XXS.gguf"
stamp "files written"

tokens="$(python3 -c 'print(",".join(str((i * 7919 + 13) % 150000) for i in range(2100)))')"
logits() {  # out settings...
  local out="$1"; shift
  env "$@" "$R" logits -m "$M" --device cuda --kv f32 --chunk 1 --tokens "$tokens" --out "$out" \
    > "$out.log" 2>&1 || tail -3 "$out.log"
}
logits "$W/defaults.f32" REDLITE_UNUSED=0
# shellcheck disable=SC2086
logits "$W/options.f32" $OPTS
bits_ok=0
if cmp -s "$W/defaults.f32" "$W/options.f32"; then
  bits_ok=1; note "bits (f32 KV, 2,100 tokens), options vs defaults: same"
else
  note "bits, options vs defaults: DIFFERENT $(python3 "$ROOT/scripts/device/logits_drift.py" \
    "$W/defaults.f32" "$W/options.f32" | tail -1)"
fi
rm -f "$W/defaults.f32" "$W/options.f32"
# shellcheck disable=SC2086
(export $OPTS; run_tests "$D" routing)

AB="${OPTS// /+}"
M="$M" AB="$AB" KV=f32 DEPTHS=4096 ROUNDS=2 TAG=f32 bash "$ROOT/scripts/device/ab_rounds.sh"
gain="$(python3 - "$OUT" "$AB" <<'PY'
import glob, re, statistics, sys
out, ab = sys.argv[1:3]
def mean(v):
    xs = [float(t) for p in glob.glob(f"{out}/abf32-{re.sub('[=+]', '_', v)}-*.txt")
          for t in re.findall(r"^\|\s*tg[^|]*\|\s*([\d.]+)", open(p).read(), re.M)]
    return statistics.mean(xs) if xs else float("nan")
print(f"{mean(ab) / mean('REDLITE_UNUSED=0') - 1:.4f}")
PY
)"
choice=REDLITE_UNUSED=0
[ "$bits_ok" = 1 ] && python3 -c "import sys; sys.exit(not float(sys.argv[1]) > 0.001)" "$gain" && choice="$OPTS"
stamp "f32 rounds: options $gain against the defaults; the matrix runs with: $choice"

if [ "$LEAN" = 1 ]; then
  M="$M" AB="$AB" KV=f16 DEPTHS=0,4096 ROUNDS=1 TAG=f16 bash "$ROOT/scripts/device/ab_rounds.sh"
  stamp end; exit 0
fi
matrix() {  # kv rounds
  # shellcheck disable=SC2086
  env $choice RECIPES=IQ2_XXS,IQ1_M KV="$1" PP=0 ROUNDS="$2" OUT="$OUT/matrix-$1" \
    bash "$VS" all 2>&1 | tee -a "$SUMMARY"
}
matrix f32 "${MROUNDS:-2}"
[ "$SECONDS" -lt "${F16_BEFORE:-420}" ] && matrix f16 1
stamp end
