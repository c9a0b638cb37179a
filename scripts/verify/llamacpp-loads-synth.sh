#!/usr/bin/env bash
# Writes synthetic files with `redlite synth` (every recipe, both DeltaNet layouts, an MTP
# block, the real Qwen vocabulary; FULL=1 adds the full-size 80B-A3B IQ2_XXS file), then for
# each: llama.cpp loads it and generates tokens (llama-simple), and `redlite inspect --json`
# is compared with the gguf Python package's reader.
#
#   bash scripts/reference/setup.sh            # once: llama.cpp (CPU) + venv
#   cargo build --release
#   bash scripts/verify/llamacpp-loads-synth.sh [OUT_DIR]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT="${1:-$ROOT/.cache/verify}"
REF="${REF_DIR:-$ROOT/.cache/reference}"
BIN="$REF/build/bin"
PY="$REF/venv/bin/python"
REDLITE="$ROOT/target/release/redlite"
mkdir -p "$OUT"

cases=(
  "tiny-F32:--recipe F32"
  "tiny-F16:--recipe F16"
  "tiny-Q4_K_M:--recipe Q4_K_M"
  "tiny-IQ2_XXS:--recipe IQ2_XXS"
  "tiny-IQ2_XS:--recipe IQ2_XS"
  "tiny-IQ1_M:--recipe IQ1_M"
  "tiny-legacy-F32:--recipe F32 --layout legacy"
  "tiny-legacy-IQ2_XXS:--recipe IQ2_XXS --layout legacy"
  "tiny-mtp-F32:--recipe F32 --mtp"
  "tiny-qwenvocab-F16:--recipe F16 --vocab qwen"
  "full-8layers-IQ2_XXS:--preset full --layers 8 --recipe IQ2_XXS"
)
[ "${FULL:-0}" = "1" ] && cases+=("full-IQ2_XXS:--preset full --recipe IQ2_XXS")

printf '%-24s %-10s %-8s %s\n' file size synth_s "llama.cpp output (4 tokens after 'The capital')"
for c in "${cases[@]}"; do
  name="${c%%:*}"; flags="${c#*:}"
  f="$OUT/$name.gguf"
  t0=$(date +%s.%N)
  # shellcheck disable=SC2086
  "$REDLITE" synth "$f" $flags > "$OUT/$name.synth.log" 2>&1
  t1=$(date +%s.%N)
  size=$(du -h "$f" | cut -f1)
  if "$BIN/llama-simple" -m "$f" -n 4 "The capital" > "$OUT/$name.llama.log" 2>&1; then
    gen=$(grep -a -m1 '^The capital' "$OUT/$name.llama.log" | cut -c1-60 | tr -d '\n')
    status="ok"
  else
    gen="FAILED: $(grep -a -m1 -iE 'error|failed' "$OUT/$name.llama.log" | cut -c1-120)"
    status="fail"
  fi
  printf '%-24s %-10s %-8.1f %s %q\n' "$name" "$size" "$(echo "$t1 - $t0" | bc)" "$status" "$gen"
  "$PY" "$ROOT/scripts/verify/compare_inspect.py" "$REDLITE" "$f" | sed 's/^/    /'
  [ "$status" = ok ] || exit 1
done
