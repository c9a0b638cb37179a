#!/usr/bin/env bash
# On the GPU machine: llama.cpp (CUDA, sm_90) and redlite on the same synthetic full-size
# 80B-A3B file, run alternately; prints both and the ratio. Builds nothing of redlite there:
# carry target/release/redlite (built here with `cargo build --release --features cuda`) or
# scripts/device/prepare.sh's .cache/device/redlite.xz (unpacked there when needed), and
# .cache/device/llama-src.tgz (llama.cpp sources packed from the pinned sdist: see
# docs/PERF.md), then:
#
#   bash scripts/bench/vs-llamacpp-cuda.sh build     # llama-bench, in the background (~5 min)
#   bash scripts/bench/vs-llamacpp-cuda.sh synth     # the model file (RECIPE, default IQ2_XXS)
#   bash scripts/bench/vs-llamacpp-cuda.sh bench     # waits for the build, then both benches
#
# Env: WORK (default /tmp/rl), RECIPE (IQ2_XXS; RECIPES, a list, for `all`), TG (128), DEPTHS
# (0,4096), PP (512; 0: no prompt test, which at depth 32768 saves most of a round), ROUNDS (2),
# KV (redlite's KV cache: f32, f16, or a list such as f16,f32: each round runs llama-bench once,
# with its default f16 cache, then redlite once per listed type), OUT (where logs go; $OUT on the
# device machine). llama-bench takes no f32 cache (its `-ctk`/`-ctv` parser knows f16, bf16 and
# the quantized types; f32 is "invalid parameter", measured), so the f32 cells are against its
# f16 default.
#
# Issue 6's matrix, each recipe on one warm machine after `build` (llama.cpp builds in 2 to 6
# minutes on an H100; `bench` waits for it):
#   RECIPE=IQ1_M bash scripts/bench/vs-llamacpp-cuda.sh synth
#   RECIPE=IQ1_M KV=f16,f32 PP=0 DEPTHS=0,4096,32768 ROUNDS=1 bash scripts/bench/vs-llamacpp-cuda.sh bench
# or both recipes in one call (about 8 minutes at depths 0 and 4096, most of it the build):
#   RECIPES=IQ2_XXS,IQ1_M KV=f16,f32 PP=0 ROUNDS=1 bash scripts/bench/vs-llamacpp-cuda.sh all
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
WORK="${WORK:-/tmp/rl}"; RECIPE="${RECIPE:-IQ2_XXS}"; TG="${TG:-128}"; PP="${PP:-512}"
DEPTHS="${DEPTHS:-0,4096}"; ROUNDS="${ROUNDS:-2}"; KV="${KV:-f32}"; LOGS="${OUT:-$WORK/logs}"
MODEL="$WORK/full-$RECIPE.gguf"
mkdir -p "$WORK" "$LOGS"
# The device's CUDA libraries on the loader path, D (the carried files) and `unpack`.
# shellcheck source=scripts/device/common.sh
source "$ROOT/scripts/device/common.sh"

# target/release/redlite, unpacked from prepare.sh's redlite.xz when only that was carried (a
# call that carried the xz alone once waited out its limit on a missing binary).
ensure_redlite() {
  local bin="$ROOT/target/release/redlite"
  [ -x "$bin" ] && return
  [ -f "$D/redlite.xz" ] || { echo "neither $bin nor $D/redlite.xz: carry one of them" >&2; exit 1; }
  unpack "$D/redlite.xz" "$bin"
}

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
  ensure_redlite
  [ -f "$MODEL" ] || "$ROOT/target/release/redlite" synth "$MODEL" --preset full --recipe "$RECIPE" 2>&1 | tail -1
  ;;
bench)
  ensure_redlite
  [ -f "$MODEL" ] || { echo "no $MODEL: run synth first" >&2; exit 1; }
  while [ ! -f "$WORK/llama/build.done" ]; do sleep 5; done
  [ -x "$WORK/llama/build/bin/llama-bench" ] || { tail -20 "$WORK/llama/build.log"; exit 1; }
  # llama-bench takes -p 0 as "no prompt test"; so does redlite's bench.
  for round in $(seq 1 "$ROUNDS"); do
    "$WORK/llama/build/bin/llama-bench" -m "$MODEL" -ngl 99 -fa 1 -p "$PP" -n "$TG" -d "$DEPTHS" -r 3 -o json \
      > "$LOGS/llamacpp-$round.json" 2> "$LOGS/llamacpp-$round.log" || tail -5 "$LOGS/llamacpp-$round.log"
    for kv in ${KV//,/ }; do
      "$ROOT/target/release/redlite" bench -m "$MODEL" --device cuda --kv "$kv" -p "$PP" -n "$TG" -d "$DEPTHS" -r 3 --json \
        > "$LOGS/redlite-$kv-$round.json" 2> "$LOGS/redlite-$kv-$round.log" || tail -5 "$LOGS/redlite-$kv-$round.log"
    done
  done
  python3 - "$LOGS" "$ROUNDS" "$MODEL" "$KV" <<'PY'
import json, sys, statistics, os
logs, rounds, model, kvs = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4].split(",")
# rows[test] = [llama.cpp figures, {kv: redlite figures}]
rows = {}
def row(name):
    return rows.setdefault(name, [[], {kv: [] for kv in kvs}])
for r in range(1, rounds + 1):
    try:
        for x in json.load(open(f"{logs}/llamacpp-{r}.json")):
            if x["n_gen"] == 0 and x["n_prompt"] == 0:
                continue
            name = f"pp{x['n_prompt']}" if x["n_gen"] == 0 else f"tg{x['n_gen']}"
            name += f" @ d{x['n_depth']}" if x.get("n_depth") else ""
            row(name)[0].append(x["avg_ts"])
    except Exception as e:
        print("llama.cpp round", r, "unreadable:", e)
    for kv in kvs:
        try:
            for x in json.load(open(f"{logs}/redlite-{kv}-{r}.json"))["results"]:
                row(x["test"])[1][kv].append(x["avg_ts"])
        except Exception as e:
            print(f"redlite ({kv} KV) round", r, "unreadable:", e)
mean = lambda xs: statistics.mean(xs) if xs else float("nan")
print(f"file {os.path.basename(model)}, {rounds} alternating rounds; llama.cpp with its f16 KV cache")
print("| test | llama.cpp t/s | " + " | ".join(f"redlite {kv} KV | ratio" for kv in kvs) + " |")
print("|---|---|" + "---|---|" * len(kvs))
for name, (l, ours) in rows.items():
    lm = mean(l)
    cells = " | ".join(f"{mean(ours[kv]):.1f} | {mean(ours[kv]) / lm:.2f}x" for kv in kvs)
    print(f"| {name} | {lm:.1f} | {cells} |")
PY
  ;;
all)
  # Every recipe of RECIPES (default RECIPE) in one call: the files are written while llama.cpp
  # builds, then each recipe's benches, its logs under $LOGS/RECIPE.
  recipes="${RECIPES:-$RECIPE}"
  "$0" build
  for r in ${recipes//,/ }; do RECIPE="$r" "$0" synth; done
  for r in ${recipes//,/ }; do RECIPE="$r" OUT="$LOGS/$r" "$0" bench; done
  ;;
esac
