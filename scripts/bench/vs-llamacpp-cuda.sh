#!/usr/bin/env bash
# On the GPU machine: llama.cpp (CUDA, sm_90) and redlite on the same synthetic full-size
# 80B-A3B file, run alternately; prints both and the ratio. Builds nothing of redlite there:
# carry target/release/redlite (built here with `cargo build --release --features cuda`) and
# .cache/device/llama-src.tgz (llama.cpp sources packed from the pinned sdist: see
# docs/PERF.md), then:
#
#   bash scripts/bench/vs-llamacpp-cuda.sh build     # llama-bench, in the background (~5 min)
#   bash scripts/bench/vs-llamacpp-cuda.sh synth     # the model file (RECIPE, default IQ2_XXS)
#   bash scripts/bench/vs-llamacpp-cuda.sh bench     # waits for the build, then both benches
#
# Env: WORK (default /tmp/rl), RECIPE (IQ2_XXS), TG (128), DEPTHS (0,4096), PP (512),
# ROUNDS (2), KV (f32), OUT (where logs go; $OUT on the device machine).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
WORK="${WORK:-/tmp/rl}"; RECIPE="${RECIPE:-IQ2_XXS}"; TG="${TG:-128}"; PP="${PP:-512}"
DEPTHS="${DEPTHS:-0,4096}"; ROUNDS="${ROUNDS:-2}"; KV="${KV:-f32}"; LOGS="${OUT:-$WORK/logs}"
MODEL="$WORK/full-$RECIPE.gguf"
mkdir -p "$WORK" "$LOGS"
export LD_LIBRARY_PATH="/usr/local/cuda-13.0/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}"

case "${1:-all}" in
build)
  # Not again while an earlier call's build runs on this machine (its log exists).
  if [ ! -x "$WORK/llama/build/bin/llama-bench" ] && [ ! -f "$WORK/llama/build.log" ]; then
    mkdir -p "$WORK/llama" && tar xzf "$ROOT/.cache/device/llama-src.tgz" -C "$WORK/llama"
    echo 'add_subdirectory(llama-bench)' > "$WORK/llama/tools/CMakeLists.txt"
    (cd "$WORK/llama" && setsid nohup bash -c 'cmake -B build -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
      -DLLAMA_CURL=OFF -DCMAKE_BUILD_TYPE=Release > build.log 2>&1 && cmake --build build -j 14 --target llama-bench >> build.log 2>&1; echo done > build.done' \
      > /dev/null 2>&1 &)
    echo "llama.cpp build started in $WORK/llama (log: build.log)"
  fi
  ;;
synth)
  [ -f "$MODEL" ] || "$ROOT/target/release/redlite" synth "$MODEL" --preset full --recipe "$RECIPE" 2>&1 | tail -1
  ;;
bench)
  while [ ! -f "$WORK/llama/build.done" ]; do sleep 5; done
  [ -x "$WORK/llama/build/bin/llama-bench" ] || { tail -20 "$WORK/llama/build.log"; exit 1; }
  for round in $(seq 1 "$ROUNDS"); do
    "$WORK/llama/build/bin/llama-bench" -m "$MODEL" -ngl 99 -fa 1 -p "$PP" -n "$TG" -d "$DEPTHS" -r 3 -o json \
      > "$LOGS/llamacpp-$round.json" 2> "$LOGS/llamacpp-$round.log" || tail -5 "$LOGS/llamacpp-$round.log"
    "$ROOT/target/release/redlite" bench -m "$MODEL" --device cuda --kv "$KV" -p "$PP" -n "$TG" -d "$DEPTHS" -r 3 --json \
      > "$LOGS/redlite-$round.json" 2> "$LOGS/redlite-$round.log" || tail -5 "$LOGS/redlite-$round.log"
  done
  python3 - "$LOGS" "$ROUNDS" "$MODEL" <<'PY'
import json, sys, statistics, os
logs, rounds, model = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rows = {}
for r in range(1, rounds + 1):
    try:
        for x in json.load(open(f"{logs}/llamacpp-{r}.json")):
            name = f"pp{x['n_prompt']}" if x["n_gen"] == 0 else f"tg{x['n_gen']}" + (f" @ d{x['n_depth']}" if x.get("n_depth") else "")
            rows.setdefault(name, [[], []])[0].append(x["avg_ts"])
    except Exception as e:
        print("llama.cpp round", r, "unreadable:", e)
    try:
        for x in json.load(open(f"{logs}/redlite-{r}.json"))["results"]:
            rows.setdefault(x["test"], [[], []])[1].append(x["avg_ts"])
    except Exception as e:
        print("redlite round", r, "unreadable:", e)
print(f"file {os.path.basename(model)}, {rounds} alternating rounds")
print("| test | llama.cpp t/s | redlite t/s | ratio |\n|---|---|---|---|")
for name, (l, o) in rows.items():
    lm = statistics.mean(l) if l else float("nan"); om = statistics.mean(o) if o else float("nan")
    print(f"| {name} | {lm:.1f} | {om:.1f} | {om / lm:.2f}x |")
PY
  ;;
all) "$0" build; "$0" synth; "$0" bench ;;
esac
