#!/usr/bin/env bash
# The quality table of the demo model's files: perplexity on the held-out text and the KL
# divergence from the F16 file (mean KLD, top-1 agreement), each by redlite and by llama.cpp's
# llama-perplexity (the same procedure: chunks of CTX tokens, the second half of each scored),
# on the same files and text. Prints a markdown table; logs go to OUT_DIR.
#
#   bash tools/train/quality.sh F16.gguf HELDOUT.txt OUT_DIR QUANT.gguf...
#   (LLAMA_BIN: llama.cpp's build/bin, default .cache/reference/build/bin; CTX: 512;
#    REDLITE: the binary, default target/release/redlite)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
F16="$1"; TEXT="$2"; OUT="$3"; shift 3
BIN="${LLAMA_BIN:-$ROOT/.cache/reference/build/bin}"
R="${REDLITE:-$ROOT/target/release/redlite}"
CTX="${CTX:-512}"
export LD_LIBRARY_PATH="$BIN:${LD_LIBRARY_PATH:-}"
mkdir -p "$OUT"

# llama.cpp's KLD mode reads the base model's logits from a file it writes first.
[ -f "$OUT/base.kld" ] || "$BIN/llama-perplexity" -m "$F16" -f "$TEXT" -c "$CTX" \
  --kl-divergence-base "$OUT/base.kld" > "$OUT/llama-base.log" 2>&1

field() { grep -m1 "$1" "$2" | sed -E "s/.*$1[^0-9]*([0-9.]+).*/\1/"; }
echo "| file | MB | PPL redlite | PPL llama.cpp | KLD redlite | KLD llama.cpp | same top-1 redlite | same top-1 llama.cpp |"
echo "|---|---|---|---|---|---|---|---|"
for f in "$F16" "$@"; do
  n="$(basename "$f" .gguf)"
  # Each result is kept: a second run only prints the table again.
  [ -s "$OUT/$n.redlite-ppl" ] || "$R" perplexity -m "$f" -f "$TEXT" --ctx "$CTX" \
    > "$OUT/$n.redlite-ppl" 2> /dev/null
  [ -s "$OUT/$n.redlite-kld" ] || "$R" kld -m "$f" --base "$F16" -f "$TEXT" --ctx "$CTX" \
    > "$OUT/$n.redlite-kld" 2> /dev/null
  [ -s "$OUT/$n.llama-ppl" ] || "$BIN/llama-perplexity" -m "$f" -f "$TEXT" -c "$CTX" \
    > "$OUT/$n.llama-ppl" 2>&1
  [ -s "$OUT/$n.llama-kld" ] || "$BIN/llama-perplexity" -m "$f" -f "$TEXT" -c "$CTX" \
    --kl-divergence-base "$OUT/base.kld" --kl-divergence > "$OUT/$n.llama-kld" 2>&1
  printf '| %s | %.1f | %s | %s | %s | %s | %s %% | %s %% |\n' "$n" \
    "$(echo "$(stat -c %s "$f") / 1000000" | bc -l)" \
    "$(field 'PPL =' "$OUT/$n.redlite-ppl")" "$(field 'PPL =' "$OUT/$n.llama-ppl")" \
    "$(field 'Mean    KLD:' "$OUT/$n.redlite-kld")" "$(field 'Mean    KLD:' "$OUT/$n.llama-kld")" \
    "$(field 'Same top p *:' "$OUT/$n.redlite-kld")" "$(field 'Same top p *:' "$OUT/$n.llama-kld")"
done
