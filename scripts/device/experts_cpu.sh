#!/usr/bin/env bash
# On the GPU machine, one call: `--experts cpu` (every MoE block on the CPU, the rest on the
# GPU) checked and measured. The expert cache's GPU tests (with the CPU-experts parity test),
# then the full IQ2_XXS file: redlite `--experts cpu` against llama.cpp with every layer's
# experts on the CPU (`-ncmoe 99`, the anchor's "all experts on the CPU"), same machine.
# Carry .cache/device/redlite.xz, .cache/device/cuda_expert_cache, .cache/device/llama-src.tgz.
#
#   bash scripts/device/experts_cpu.sh
#
# Env: PP (512), TG (64), OUT (logs; summary.txt last).
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
W=/tmp/rl; OUT="${OUT:-$W/results}"; mkdir -p "$W" "$OUT" "$ROOT/target/release"
PP="${PP:-512}"; TG="${TG:-64}"; R="$ROOT/target/release/redlite"; M="$W/full-IQ2_XXS.gguf"
SUMMARY="$OUT/summary.txt"
export LD_LIBRARY_PATH="/usr/local/cuda-13.0/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}"
# shellcheck source=scripts/device/common.sh
source "$ROOT/scripts/device/common.sh"
python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
  "$ROOT/.cache/device/redlite.xz" "$R" && chmod +x "$R"
bash "$ROOT/scripts/bench/vs-llamacpp-cuda.sh" build
[ -f "$M" ] || "$R" synth "$M" --preset full --recipe IQ2_XXS 2>&1 | tail -1 | tee -a "$SUMMARY"
stamp "cuda_expert_cache tests"
"$ROOT/.cache/device/cuda_expert_cache" --test-threads=1 > "$OUT/cuda_expert_cache.log" 2>&1
note "cuda_expert_cache: $(grep -E '^test result' "$OUT/cuda_expert_cache.log" | tail -1)"
grep -E 'panicked|FAILED' "$OUT/cuda_expert_cache.log" | head -5 | tee -a "$SUMMARY"
# Both measurements on a quiet machine: the CPU pool's threads wait for each other at the end
# of every region, so the build's compile jobs would slow redlite down 4x (docs/PERF.md).
stamp "waiting for llama.cpp's build"
while [ ! -f "$W/llama/build.done" ]; do sleep 5; done
stamp "redlite --experts cpu"
"$R" bench -m "$M" --device cuda --experts cpu -p "$PP" -n "$TG" -r 2 --json \
  > "$OUT/redlite.json" 2> "$OUT/redlite.log" || tail -5 "$OUT/redlite.log" | tee -a "$SUMMARY"
stamp "llama-bench -ncmoe 99"
"$W/llama/build/bin/llama-bench" -m "$M" -ngl 99 -fa 1 -ncmoe 99 -p "$PP" -n "$TG" -r 2 -o json \
  > "$OUT/llamacpp.json" 2> "$OUT/llamacpp.log" || tail -5 "$OUT/llamacpp.log" | tee -a "$SUMMARY"
stamp "done"
python3 - "$OUT" <<'PY' | tee -a "$SUMMARY"
import json, sys
out = sys.argv[1]
llama = {}
try:
    for x in json.load(open(f"{out}/llamacpp.json")):
        llama[f"pp{x['n_prompt']}" if x["n_gen"] == 0 else f"tg{x['n_gen']}"] = x["avg_ts"]
except Exception as e:
    print("llama.cpp unreadable:", e)
print("IQ2_XXS, every MoE block on the CPU: llama.cpp -ncmoe 99 vs redlite --experts cpu")
print("| test | llama.cpp t/s | redlite t/s | ratio |")
print("|---|---|---|---|")
try:
    for x in json.load(open(f"{out}/redlite.json"))["results"]:
        l = llama.get(x["test"], float("nan"))
        print(f"| {x['test']} | {l:.1f} | {x['avg_ts']:.1f} | {x['avg_ts'] / l:.2f}x |")
except Exception as e:
    print("redlite unreadable:", e)
PY
