#!/usr/bin/env bash
# Regenerates the reference goldens under tests/golden/ (a development tool; CI never runs it,
# the Rust tests read what it wrote):
#   1. scripts/reference/setup.sh with torch/transformers (venv + llama.cpp CPU build, pinned),
#   2. the golden models with `redlite synth` (deterministic; written to .cache/reference/golden-models),
#   3. scripts/reference/goldens.py: llama.cpp and transformers logits/hidden states ->
#      tests/golden/<model>.bin, tests/golden/manifest.json, tests/golden/agreement.md.
#
#   bash scripts/reference/make_goldens.sh            # THREADS=2 by default
# Env: REF_DIR (default .cache/reference), REDLITE (default target/release/redlite; built with
# `cargo build --release -p redlite-cli` when missing), THREADS, ONLY=name,name (subset; the
# manifest then lists only those models).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
W="${REF_DIR:-$ROOT/.cache/reference}"
THREADS="${THREADS:-2}"
LCP_VERSION=0.3.36
start=$(date +%s)

REF_WITH_TORCH=1 THREADS="$THREADS" bash "$ROOT/scripts/reference/setup.sh"
PY="$W/venv/bin/python"
export PYTHONPATH="$W/llama_cpp_python-$LCP_VERSION${PYTHONPATH:+:$PYTHONPATH}"
export LLAMA_CPP_LIB_PATH="$W/build/bin"
export THREADS
LLAMA_COMMIT="$(sed -n 's/.*LLAMA_COMMIT = "\(.*\)".*/\1/p' "$W/build/common/build-info.cpp" 2>/dev/null | head -1)"
LCP_SDIST_SHA256="$(sha256sum "$W/dl/llama_cpp_python-$LCP_VERSION.tar.gz" | cut -d' ' -f1)"
export LLAMA_COMMIT LCP_SDIST_SHA256

BIN="${REDLITE:-$ROOT/target/release/redlite}"
if [ ! -x "$BIN" ]; then
  (cd "$ROOT" && cargo build --release -p redlite-cli)
fi
MD="$W/golden-models"
mkdir -p "$MD"
"$PY" "$ROOT/scripts/reference/goldens.py" --list | while read -r name args; do
  # shellcheck disable=SC2086
  "$BIN" synth "$MD/$name.gguf" $args >/dev/null
  echo "synth $name: $(sha256sum "$MD/$name.gguf" | cut -c1-16)…"
done

mkdir -p "$ROOT/tests/golden"
"$PY" "$ROOT/scripts/reference/goldens.py" "$MD" "$ROOT/tests/golden" --threads "$THREADS" \
    --table "$ROOT/tests/golden/agreement.md" ${ONLY:+--only "$ONLY"}
echo "goldens written to tests/golden/ in $(( $(date +%s) - start )) s"
