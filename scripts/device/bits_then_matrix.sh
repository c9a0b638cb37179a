#!/usr/bin/env bash
# On the GPU machine, one call for a change meant to keep the bits, then issue 6's matrix with
# it. Carry .cache/device/redlite.xz (this build), redlite-base.xz (the earlier one; copy
# redlite.xz there before scripts/device/prepare.sh) and llama-src.tgz; about 8 minutes, most of
# it llama.cpp's build (started first, niced, in the background while steps 1 and 2 run):
#   1. bits: `redlite logits --chunk 1 --kv f32` over 2,100 tokens (past the attention's split
#      length) on the IQ2_XXS+MTP file by this build and by the earlier one under BASE_ENV
#      (settings it needs to be the same math, e.g. compile options this build made its only
#      order), compared byte for byte;
#   2. issue 9: `bench -p 0 -n 128 -r 3 --mtp --draft K --mtp-accept 0.7` for each K of MTP_DRAFTS
#      (1 2 3; empty: none) by both builds (each times plain decoding first); the file is then
#      deleted (the disk holds two full files and llama.cpp's build, not three);
#   3. vs-llamacpp-cuda.sh on both recipes with f32 KV (MROUNDS rounds, 2), then f16 KV for one
#      round if the call is younger than F16_BEFORE seconds (420).
# Without redlite-base.xz step 1 and the earlier build's runs of step 2 are left out; with
# MATRIX=0, llama.cpp's build and step 3 (about 3 minutes then). llama.cpp's build runs beside
# steps 1 and 2 (niced; redlite's host thread keeps its priority).
#
#   BASE_ENV="REDLITE_X=1" bash scripts/device/bits_then_matrix.sh
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# shellcheck source=scripts/device/common.sh
source "$ROOT/scripts/device/common.sh"
R="$ROOT/target/release/redlite"; unpack "$D/redlite.xz" "$R"
VS="$ROOT/scripts/bench/vs-llamacpp-cuda.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$SUMMARY"
stamp "start"
MATRIX="${MATRIX:-1}"
[ "$MATRIX" = 1 ] && nice -n 19 bash "$VS" build
M="$W/full-IQ2_XXS-mtp.gguf"
"$R" synth "$M" --preset full --recipe IQ2_XXS --mtp 2>&1 | tail -1 | tee -a "$SUMMARY"
B=""
if [ -f "$D/redlite-base.xz" ]; then
  B="$W/redlite-base"; unpack "$D/redlite-base.xz" "$B"
  tokens="$(python3 -c 'print(",".join(str((i * 7919 + 13) % 150000) for i in range(2100)))')"
  logits() {  # binary out settings...
    local bin="$1" out="$2"; shift 2
    env "$@" "$bin" logits -m "$M" --device cuda --kv f32 --chunk 1 --tokens "$tokens" \
      --out "$out" > "$out.log" 2>&1 || tail -3 "$out.log"
  }
  logits "$R" "$W/this.f32" REDLITE_UNUSED=0
  # shellcheck disable=SC2086
  logits "$B" "$W/base.f32" REDLITE_UNUSED=0 ${BASE_ENV:-}
  if cmp -s "$W/this.f32" "$W/base.f32"; then
    note "bits (f32 KV, 2,100 tokens), this build vs the earlier one${BASE_ENV:+ with $BASE_ENV}: same"
  else
    note "bits, this build vs the earlier one: DIFFERENT $(python3 "$ROOT/scripts/device/logits_drift.py" \
      "$W/base.f32" "$W/this.f32" | tail -1)"
  fi
  rm -f "$W/this.f32" "$W/base.f32"
  stamp "bits done"
fi

for k in ${MTP_DRAFTS-1 2 3}; do
  for bin in "$R" $B; do
    name="mtp$k-$(basename "$bin")"
    run=("$bin")
    # shellcheck disable=SC2206
    [ "$bin" = "$B" ] && run=(env ${BASE_ENV:-REDLITE_UNUSED=0} "$bin")
    "${run[@]}" bench -m "$M" --device cuda -p 0 -n 128 -r 3 --mtp --draft "$k" \
      --mtp-accept 0.7 --json > "$W/$name.json" 2> "$W/$name.err"
    note "$name: $(python3 -c 'import json, sys
for r in json.load(open(sys.argv[1]))["results"]:
    print(r["test"], " ".join(f"{x:.2f}" for x in r["samples_ts"]), end="; ")' "$W/$name.json")"
  done
done
rm -f "$M"
stamp "MTP done"
# shellcheck disable=SC2046
tgz() { tar czf "$OUT/runs.tgz" -C "$W" $(cd "$W" && ls -d matrix-* mtp*.json mtp*.err 2>/dev/null); }
[ "$MATRIX" = 1 ] || { tgz; stamp end; exit 0; }
for r in IQ2_XXS IQ1_M; do RECIPE=$r bash "$VS" synth | tee -a "$SUMMARY"; done
stamp "files written"

# Each run's JSON and log under $W, then one archive in $OUT (a call brings back few files).
matrix() {  # kv rounds
  RECIPES=IQ2_XXS,IQ1_M KV="$1" PP=0 ROUNDS="$2" OUT="$W/matrix-$1" bash "$VS" all 2>&1 \
    | tee -a "$SUMMARY"
}
matrix f32 "${MROUNDS:-2}"
[ "$SECONDS" -lt "${F16_BEFORE:-420}" ] && matrix f16 1
tgz
stamp end
