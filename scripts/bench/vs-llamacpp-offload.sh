#!/usr/bin/env bash
# On the GPU machine: a GPU smaller than the model, emulated on the H200. llama.cpp with the
# experts of its first NCMOE layers on the CPU (`--n-cpu-moe`, its answer for small GPUs)
# against redlite with `--gpu-limit LIMIT` (the plan's expert cache, the experts in
# page-locked host memory), same file, same run, alternating. Records each engine's peak
# GPU memory (nvidia-smi, sampled every 200 ms) and redlite's cache hit rate and PCIe bytes
# per token. Needs llama-bench built by `vs-llamacpp-cuda.sh build` and
# target/release/redlite.
#
#   RECIPE=Q4_K_M LIMIT=24GiB NCMOE=26 bash scripts/bench/vs-llamacpp-offload.sh synth
#   RECIPE=Q4_K_M LIMIT=24GiB NCMOE=26 bash scripts/bench/vs-llamacpp-offload.sh bench
#
# Env: WORK (/tmp/rl), RECIPE (Q4_K_M), LIMIT (24GiB), NCMOE (26), PP (512), TG (128),
# ROUNDS (1), OUT (logs), SPREAD (0; 1: redlite's routing spread uniformly over the experts,
# REDLITE_BENCH_ROUTE_SPREAD=1, the cache's worst case: random weights route to few experts);
# REDLITE_BENCH_ROUTE_SKEW and REDLITE_CACHE_POLICY pass through to redlite (docs/CUDA.md).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
WORK="${WORK:-/tmp/rl}"; RECIPE="${RECIPE:-Q4_K_M}"; LIMIT="${LIMIT:-24GiB}"
NCMOE="${NCMOE:-26}"; PP="${PP:-512}"; TG="${TG:-128}"; ROUNDS="${ROUNDS:-1}"
LOGS="${OUT:-$WORK/logs}"; MODEL="$WORK/full-$RECIPE.gguf"; R="$ROOT/target/release/redlite"
SPREAD="${SPREAD:-0}"; TAG="$RECIPE-$LIMIT"; [ "$SPREAD" = 1 ] && TAG="$TAG-spread"
SKEW="${REDLITE_BENCH_ROUTE_SKEW:-0}"; [ "$SKEW" != 0 ] && TAG="$TAG-skew$SKEW"
mkdir -p "$WORK" "$LOGS"
export LD_LIBRARY_PATH="/usr/local/cuda-13.0/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}"

# Runs "$@" while sampling the GPU's memory in use; the peak (MiB) goes to file $PEAK.
with_peak() {
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 > "$PEAK.samples" &
  local sampler=$!
  "$@" || true
  kill "$sampler" 2> /dev/null; wait "$sampler" 2> /dev/null || true
  sort -n "$PEAK.samples" | tail -1 > "$PEAK"
}

case "${1:-bench}" in
synth)
  [ -f "$MODEL" ] || "$R" synth "$MODEL" --preset full --recipe "$RECIPE" 2>&1 | tail -1
  ;;
bench)
  while [ ! -f "$WORK/llama/build.done" ]; do sleep 5; done
  "$R" plan -m "$MODEL" --gpu-limit "$LIMIT" > "$LOGS/plan-$TAG.txt" 2>&1 || true
  for round in $(seq 1 "$ROUNDS"); do
    PEAK="$LOGS/peak-llamacpp-$TAG-$round" with_peak "$WORK/llama/build/bin/llama-bench" -m "$MODEL" \
      -ngl 99 -fa 1 -ncmoe "$NCMOE" -p "$PP" -n "$TG" -r 2 -o json \
      > "$LOGS/llamacpp-$TAG-$round.json" 2> "$LOGS/llamacpp-$TAG-$round.log"
    PEAK="$LOGS/peak-redlite-$TAG-$round" with_peak env REDLITE_BENCH_ROUTE_SPREAD="$SPREAD" \
      "$R" bench -m "$MODEL" --device cuda \
      --gpu-limit "$LIMIT" -p "$PP" -n "$TG" -r 2 --json \
      > "$LOGS/redlite-$TAG-$round.json" 2> "$LOGS/redlite-$TAG-$round.log"
  done
  python3 - "$LOGS" "$ROUNDS" "$TAG" "$NCMOE" <<'PY'
import json, sys, statistics
logs, rounds, tag, ncmoe = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
rows, cache, peaks = {}, {}, {"llama.cpp": [], "redlite": []}
for r in range(1, rounds + 1):
    for engine, name in (("llama.cpp", "llamacpp"), ("redlite", "redlite")):
        try:
            peaks[engine].append(int(open(f"{logs}/peak-{name}-{tag}-{r}").read().split()[0]))
        except Exception:
            pass
    try:
        for x in json.load(open(f"{logs}/llamacpp-{tag}-{r}.json")):
            test = f"pp{x['n_prompt']}" if x["n_gen"] == 0 else f"tg{x['n_gen']}"
            rows.setdefault(test, [[], []])[0].append(x["avg_ts"])
    except Exception as e:
        print("llama.cpp round", r, "unreadable:", e)
    try:
        for x in json.load(open(f"{logs}/redlite-{tag}-{r}.json"))["results"]:
            rows.setdefault(x["test"], [[], []])[1].append(x["avg_ts"])
            if x.get("expert_cache"):
                cache[x["test"]] = x["expert_cache"]
    except Exception as e:
        print("redlite round", r, "unreadable:", e)
peak = {k: (max(v) / 1024 if v else float("nan")) for k, v in peaks.items()}
print(f"{tag}: llama.cpp -ncmoe {ncmoe} (peak {peak['llama.cpp']:.1f} GiB) vs redlite --gpu-limit "
      f"(peak {peak['redlite']:.1f} GiB), {rounds} round(s)")
print("| test | llama.cpp t/s | redlite t/s | ratio | cache hit rate | MiB copied per token |")
print("|---|---|---|---|---|---|")
for test, (l, o) in rows.items():
    lm = statistics.mean(l) if l else float("nan"); om = statistics.mean(o) if o else float("nan")
    c = cache.get(test)
    hit = f"{100 * c['hit_rate']:.1f} %" if c else "resident"
    mib = f"{c['bytes_per_token'] / 2**20:.1f}" if c else "0"
    print(f"| {test} | {lm:.1f} | {om:.1f} | {om / lm:.2f}x | {hit} | {mib} |")
PY
  ;;
esac
