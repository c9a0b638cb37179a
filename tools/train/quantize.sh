#!/usr/bin/env bash
# Quantizes the converted demo model with llama.cpp's own tools (built from the pinned sdist by
# scripts/reference/setup.sh): an importance matrix over part of the training text, then the
# files of the quality table. The IQ types need the importance matrix; the others use it too.
# The pinned llama.cpp does not run the MTP block (block MTP_BLOCK, the trunk's block count:
# 8), so the matrix has nothing for it: its tensors are kept at Q8_0 in every file (Q8_0
# itself needs no matrix), which also keeps the draft head's quality the same across files.
#
#   bash tools/train/quantize.sh demo-F16.gguf .cache/train OUT_DIR
#   (LLAMA_BIN: llama.cpp's build/bin, default .cache/reference/build/bin)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
F16="$1"; CORPUS="$2"; OUT="$3"
BIN="${LLAMA_BIN:-$ROOT/.cache/reference/build/bin}"
TYPES="${TYPES:-Q8_0 Q6_K Q4_K_M Q4_K_S IQ2_XS IQ2_XXS IQ1_M}"
export LD_LIBRARY_PATH="$BIN:${LD_LIBRARY_PATH:-}"
mkdir -p "$OUT"
name="$(basename "$F16" .gguf)"; name="${name%-F16}"

# 200 chunks of 512 tokens (~100K of the ~960K training tokens): enough statistics per column
# for a model of this size, about a minute on two cores.
[ -f "$OUT/imatrix.gguf" ] || "$BIN/llama-imatrix" -m "$F16" -f "$CORPUS/train.txt" -c 512 \
  --chunks 200 -o "$OUT/imatrix.gguf" > "$OUT/imatrix.log" 2>&1
for t in $TYPES; do
  "$BIN/llama-quantize" --imatrix "$OUT/imatrix.gguf" --tensor-type "blk\.${MTP_BLOCK:-8}\.=q8_0" \
    "$F16" "$OUT/$name-$t.gguf" "$t" \
    > "$OUT/quantize-$t.log" 2>&1
  printf '%-8s %6.1f MB\n' "$t" "$(($(stat -c %s "$OUT/$name-$t.gguf") / 100000))e-1"
done
