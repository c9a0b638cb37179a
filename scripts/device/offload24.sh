#!/usr/bin/env bash
# Issue 8 on the GPU machine in one call (all) or three on one warm machine: the full
# Q4_K_M file at --gpu-limit 24GiB, redlite's expert cache under uniform routing (its worst
# case) and under the skew published for the Qwen3 MoE family, against llama.cpp
# --n-cpu-moe NCMOE on the same file and machine. Carry .cache/device/redlite.xz and
# .cache/device/llama-src.tgz.
#
#   bash scripts/device/offload24.sh prep     # llama.cpp build, the file, NVRTC caches of
#                                             # both kernel builds, the GPU tests of TESTS
#                                             # while llama.cpp builds (~6 min)
#   bash scripts/device/offload24.sh llama    # llama-bench at each --n-cpu-moe of NCMOE
#                                             # (~1 min each)
#   bash scripts/device/offload24.sh redlite  # redlite under each routing of ROUTES
#
# ROUTES (default "uniform skew"): uniform, skew, natural (the router's own choice on the
# random weights), each optionally with a suffix naming one more setting: -serial
# (REDLITE_CACHE_OVERLAP=0: the copies before the products, the path before the eleventh
# session), -lru (REDLITE_CACHE_POLICY=lru), -prefetch (REDLITE_CACHE_PREFETCH=1).
# NCMOE: llama.cpp's --n-cpu-moe values to try (default "24 25 26"); the comparison takes the
# smallest whose peak GPU memory fits LIMIT (the issue's "smallest value that fits").
# Env: NCMOE, SKEW_DECAY (0.22), PP (512), TG (128), LIMIT (redlite's --gpu-limit, 24GiB),
# REDLITE_CACHE_POLICY (default LFU),
# RUN_TIMEOUT_S (280, each redlite run), TESTS (test binaries of .cache/device run in prep and all;
# default none). Logs and summary.txt under $OUT.
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
W=/tmp/rl; OUT="${OUT:-$W/results}"; mkdir -p "$W" "$OUT" "$ROOT/target/release"
NCMOE="${NCMOE:-24 25 26}"; SKEW_DECAY="${SKEW_DECAY:-0.22}"; PP="${PP:-512}"; TG="${TG:-128}"
R="$ROOT/target/release/redlite"; M="$W/full-Q4_K_M.gguf"; SUMMARY="$OUT/summary.txt"
export LD_LIBRARY_PATH="/usr/local/cuda-13.0/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}"
blas_lib="$(find /usr/local/cuda-13.0 /usr/local/lib /usr/lib -name 'libcublas.so*' 2>/dev/null | head -1)"
[ -n "$blas_lib" ] && export LD_LIBRARY_PATH="$(dirname "$blas_lib"):$LD_LIBRARY_PATH"
# shellcheck source=scripts/device/common.sh
source "$ROOT/scripts/device/common.sh"
if [ ! -x "$R" ]; then
  python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
    "$ROOT/.cache/device/redlite.xz" "$R" && chmod +x "$R"
fi

# Runs "$@" while sampling the GPU memory in use every 200 ms; the peak (MiB) into $1.
with_peak() {
  local peak="$1"; shift
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 > "$peak.samples" &
  local sampler=$!
  "$@"; local rc=$?
  kill "$sampler" 2> /dev/null; wait "$sampler" 2> /dev/null
  sort -n "$peak.samples" | tail -1 > "$peak"
  return $rc
}

# LIMIT in MiB (24GiB -> 24576).
limit_mib() {
  python3 -c 'import re, sys; a, u = re.fullmatch(r"([0-9.]+)\s*([GM])iB", sys.argv[1]).groups(); print(int(float(a) * (1024 if u == "G" else 1)))' "${LIMIT:-24GiB}"
}

# The card, into the summary.
machine() {
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$SUMMARY"
}

# llama-bench's CUDA build, in the background (~5 min).
start_build() {
  bash "$ROOT/scripts/bench/vs-llamacpp-cuda.sh" build
}

# The Q4_K_M file, and both kernel builds in NVRTC's disk cache.
write_file() {
  stamp "synth"
  [ -f "$M" ] || "$R" synth "$M" --preset full --recipe Q4_K_M 2>&1 | tail -1 | tee -a "$SUMMARY"
  # Both kernel builds (the uniform spread is a compile option) into NVRTC's disk cache, on
  # a small file of the same block types: every module the full file's runs load.
  "$R" synth "$W/tiny-Q4_K_M.gguf" --preset tiny --recipe Q4_K_M > /dev/null 2>&1
  stamp "NVRTC caches"
  for spread in 0 1; do
    REDLITE_BENCH_ROUTE_SPREAD=$spread "$R" bench -m "$W/tiny-Q4_K_M.gguf" --device cuda \
      --experts cache=3MiB -p 512 -n 8 -r 1 > "$OUT/warm-$spread.log" 2>&1 &
  done
  wait
  tail -3 "$OUT"/warm-*.log | tee -a "$SUMMARY"
}

# Waits for llama-bench's build; fails if it did not build.
wait_build() {
  stamp "waiting for llama.cpp's build"
  while [ ! -f "$W/llama/build.done" ]; do sleep 5; done
  [ -x "$W/llama/build/bin/llama-bench" ] || { tail -20 "$W/llama/build.log" | tee -a "$SUMMARY"; exit 1; }
}

# llama-bench at each --n-cpu-moe of NCMOE, with its peak GPU memory.
llama_runs() {
  for n in $NCMOE; do
    stamp "llama-bench -ncmoe $n"
    with_peak "$OUT/peak-llamacpp-$n" "$W/llama/build/bin/llama-bench" -m "$M" -ngl 99 -fa 1 \
      -ncmoe "$n" -p "$PP" -n "$TG" -r 2 -o json > "$OUT/llamacpp-$n.json" 2> "$OUT/llamacpp-$n.log" \
      || tail -5 "$OUT/llamacpp-$n.log" | tee -a "$SUMMARY"
    note "llama.cpp -ncmoe $n: peak $(cat "$OUT/peak-llamacpp-$n" 2> /dev/null) MiB"
    cp "$OUT/llamacpp-$n.json" "$OUT/peak-llamacpp-$n" "$W/" 2> /dev/null
    # With an argument: stop at the first value whose peak fits LIMIT (NCMOE ascending).
    if [ -n "${1:-}" ] && [ "$(cat "$OUT/peak-llamacpp-$n" 2> /dev/null || echo 999999)" -le "$(limit_mib)" ]; then
      break
    fi
  done
  rm -f "$OUT"/*.samples
}

# redlite at --gpu-limit LIMIT under each routing of ROUTES.
redlite_runs() {
  "$R" plan -m "$M" --gpu-limit "${LIMIT:-24GiB}" > "$OUT/plan.txt" 2>&1
  for route in $ROUTES; do
    case "$route" in
      uniform*) routing=(REDLITE_BENCH_ROUTE_SPREAD=1 REDLITE_BENCH_ROUTE_SKEW=0) ;;
      skew*) routing=(REDLITE_BENCH_ROUTE_SPREAD=0 REDLITE_BENCH_ROUTE_SKEW="$SKEW_DECAY") ;;
      natural*) routing=(REDLITE_BENCH_ROUTE_SPREAD=0 REDLITE_BENCH_ROUTE_SKEW=0) ;;
    esac
    case "$route" in
      *-serial) routing+=(REDLITE_CACHE_OVERLAP=0) ;;
      *-lru) routing+=(REDLITE_CACHE_POLICY=lru) ;;
      *-prefetch) routing+=(REDLITE_CACHE_PREFETCH=1) ;;
    esac
    stamp "redlite, $route routing"
    with_peak "$OUT/peak-redlite-$route" timeout "${RUN_TIMEOUT_S:-280}" env "${routing[@]}" \
      "$R" bench -m "$M" --device cuda --gpu-limit "${LIMIT:-24GiB}" -p "$PP" -n "$TG" -r 2 --json \
      > "$OUT/redlite-$route.json" 2> "$OUT/redlite-$route.log" \
      || tail -5 "$OUT/redlite-$route.log" | tee -a "$SUMMARY"
  done
}

# The table against the smallest --n-cpu-moe that fits LIMIT.
summary() {
  for n in $NCMOE; do cp "$W/llamacpp-$n.json" "$W/peak-llamacpp-$n" "$OUT/" 2> /dev/null; done
  python3 - "$OUT" "$NCMOE" "${LIMIT:-24GiB}" "$(limit_mib)" $ROUTES <<'PY' | tee -a "$SUMMARY"
import json, sys
out, ncmoe, limit, limit_mib, routes = sys.argv[1], sys.argv[2].split(), sys.argv[3], int(sys.argv[4]), sys.argv[5:]
def peak_mib(name):
    try:
        return int(open(f'{out}/peak-{name}').read().split()[0])
    except Exception:
        return None
def peak(name):
    mib = peak_mib(name)
    return "?" if mib is None else f"{mib / 1024:.1f} GiB"
# The issue's peer: the smallest --n-cpu-moe whose peak fits the limit.
fitting = [n for n in sorted(ncmoe, key=int)
           if (peak_mib(f"llamacpp-{n}") or float("inf")) <= limit_mib]
for n in sorted(ncmoe, key=int):
    print(f"llama.cpp -ncmoe {n}: peak {peak('llamacpp-' + n)}")
chosen = fitting[0] if fitting else sorted(ncmoe, key=int)[-1]
llama = {}
try:
    for x in json.load(open(f"{out}/llamacpp-{chosen}.json")):
        llama[f"pp{x['n_prompt']}" if x["n_gen"] == 0 else f"tg{x['n_gen']}"] = x["avg_ts"]
except Exception as e:
    print("llama.cpp unreadable:", e)
print(f"Q4_K_M, redlite --gpu-limit {limit}; llama.cpp -ncmoe {chosen}, the smallest of {' '.join(ncmoe)} "
      f"that fits{'' if fitting else ' (none fits: the largest tried)'} (peak {peak('llamacpp-' + chosen)})")
print("| routing (redlite) | test | llama.cpp t/s | redlite t/s | ratio | hit rate | MiB copied per token | waited ms per token | prefetched per token (used) | redlite peak |")
print("|---|---|---|---|---|---|---|---|---|---|")
for route in routes:
    try:
        results = json.load(open(f"{out}/redlite-{route}.json"))["results"]
    except Exception as e:
        print(f"| {route} | unreadable: {e} |")
        continue
    for x in results:
        l = llama.get(x["test"], float("nan"))
        c = x.get("expert_cache")
        hit = f"{100 * c['hit_rate']:.1f} %" if c else "resident"
        mib = f"{c['bytes_per_token'] / 2**20:.1f}" if c else "0"
        wait = f"{c.get('wait_ms_per_token', 0):.2f}" if c else "0"
        pre = f"{c.get('prefetched_per_token', 0):.1f} ({100 * c.get('prefetch_used', 0):.0f} %)" if c else "-"
        print(f"| {route} | {x['test']} | {l:.1f} | {x['avg_ts']:.1f} ± {x['stddev_ts']:.1f} | {x['avg_ts'] / l:.2f}x | {hit} | {mib} | {wait} | {pre} | {peak('redlite-' + route)} |")
PY
  rm -f "$OUT"/*.samples
}

ROUTES="${ROUTES:-uniform skew}"
case "${1:?prep, llama, redlite or all}" in
prep)
  machine
  start_build
  write_file
  # shellcheck disable=SC2086
  run_tests "$ROOT/.cache/device" ${TESTS:-}
  wait_build
  stamp "done"
  ;;
llama)
  [ -x "$W/llama/build/bin/llama-bench" ] || { echo "llama-bench not built: run prep first" | tee -a "$SUMMARY"; exit 1; }
  llama_runs
  stamp "done"
  ;;
redlite)
  redlite_runs
  summary
  ;;
all)
  # redlite runs while llama.cpp builds: its decode and prompt figures are the GPU's and PCIe's
  # (the cache's copies are the device's), though the file's first load is slower then.
  machine
  start_build
  write_file
  # shellcheck disable=SC2086
  run_tests "$ROOT/.cache/device" ${TESTS:-}
  redlite_runs
  wait_build
  llama_runs until-fits
  summary
  stamp "done"
  ;;
esac
