#!/usr/bin/env bash
# On the GPU machine, from the repository root, with .cache/device carried (made here by
# scripts/device/prepare.sh): builds nothing of redlite. In order:
#   1. llama.cpp (CUDA, sm_90) from the carried sources, in the background (~5 min);
#   2. the full-size synthetic files (IQ2_XXS, and IQ1_M unless QUICK=1);
#   3. parity: the kernel tests, the CUDA parity tests (also with the token-tiled prefill
#      kernel), and `redlite serve` on the GPU: 8 concurrent greedy streams against the same
#      requests alone, with the decode graph and without;
#   4. benches: redlite alone (A/B switches), then scripts/bench/vs-llamacpp-cuda.sh (both,
#      alternating) unless QUICK=1;
#   5. a short table last. Full logs in $OUT/logs.tgz, the table in $OUT/summary.txt.
#
#   bash scripts/device/run.sh            # QUICK=1: no llama.cpp, no IQ1_M
#   STAGES="parity demo" bash ...         # only these stages, of: kernels parity cache pairdrift
#                                         # grouped serve ab mtp demo profile sanitize compare offload
#                                         # prefill ncu mmaab llamabuild decode preloadtest skew
#                                         # (default: all but sanitize, offload and skew; compare and
#                                         # offload need QUICK unset)
# The offload stage (issue 8: llama.cpp --n-cpu-moe against redlite's expert cache at
# --gpu-limit 24GiB) writes the 42 GiB Q4_K_M file: run it without the stages that need the
# IQ2_XXS files (the disk holds 64 GiB).
# The skew stage (issue 8: the expert cache at --gpu-limit 16GiB under uniform and skewed
# routing, LRU and LFU) takes up to SKEW_TIMEOUT_S (300) s a run, four runs: split it over
# calls with SKEW_RUNS (e.g. "uniform-lru uniform-lfu"); each call's table shows every run
# done on the machine so far.
set -u
STAGES=" ${STAGES:-kernels parity cache pairdrift grouped serve ab mtp demo profile compare} "
[ "${SKIP_KERNELS:-0}" = 1 ] && STAGES="${STAGES/ kernels / }"
[ "${QUICK:-0}" = 1 ] && STAGES="${STAGES/ compare / }" && STAGES="${STAGES/ offload / }"
stage() { [[ "$STAGES" == *" $1 "* ]]; }
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
D="$ROOT/.cache/device"; W=/tmp/rl; QUICK="${QUICK:-0}"
RESULTS="${OUT:-$W/results}"; OUT="$W/logs"  # the bench script writes its logs to $OUT too
# The device's CUDA libraries on the loader path and `unpack` (its note and stamp are
# redefined below: this script's summary lives in $RESULTS).
# shellcheck source=scripts/device/common.sh
source "$ROOT/scripts/device/common.sh"
mkdir -p "$RESULTS"
R="$ROOT/target/release/redlite"; S="$ROOT/scripts/bench/vs-llamacpp-cuda.sh"
unpack "$D/redlite.xz" "$R"
# libcublas for the cuBLAS prompt products (the toolkit's, else the Python wheel's).
blas_lib="$(find /usr/local/cuda-13.0 /usr/local/lib /usr/lib -name 'libcublas.so*' 2>/dev/null | head -1)"
[ -n "$blas_lib" ] && export LD_LIBRARY_PATH="$(dirname "$blas_lib"):$LD_LIBRARY_PATH"
SUMMARY="$RESULTS/summary.txt"; : > "$SUMMARY"  # comes back even if the call runs out of time
note() { echo "$*" | tee -a "$SUMMARY"; }
stamp() { echo "[$SECONDS s] $*"; }

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$SUMMARY"
note "libcublas: ${blas_lib:-not found}"
# llamabuild: only start the build (a later call on the still-warm machine compares).
{ stage compare || stage offload || stage llamabuild; } && bash "$S" build
# The MTP file (the full model plus its MTP block) serves every redlite check; llama.cpp (whose
# pinned sources predate its MTP support) is compared on the files without the block.
# PLAIN=1: the file without the MTP block instead (the compare stage's own file, so a later
# call on the warm machine finds it written).
M="$W/full-IQ2_XXS-mtp.gguf"; MTP_FLAG=--mtp
[ "${PLAIN:-0}" = 1 ] && M="$W/full-IQ2_XXS.gguf" && MTP_FLAG=
for s in grouped serve ab mtp profile compare prefill ncu decode skew pairdrift; do
  [ "$s" = pairdrift ] && stage offload && break
  [ "$s" = skew ] && [ -n "${SKEW_LAYERS:-}" ] && continue  # the skew stage writes its own
  if stage "$s"; then
    [ -f "$M" ] || "$R" synth "$M" --preset full --recipe IQ2_XXS $MTP_FLAG 2>&1 | tail -1
    break
  fi
done
F="$M"
O="$ROOT/scripts/bench/vs-llamacpp-offload.sh"
stage offload && RECIPE=Q4_K_M bash "$O" synth
stage compare && RECIPE=IQ2_XXS bash "$S" synth
stage compare && RECIPE=IQ1_M bash "$S" synth

if stage kernels; then
  stamp "kernel tests"
  "$D/kernels" --test-threads=1 > "$OUT/kernels.log" 2>&1
  note "kernels: $(grep -E '^test result' "$OUT/kernels.log" | tail -1)"
  "$D/routing" --test-threads=1 > "$OUT/routing.log" 2>&1
  note "routing: $(grep -E '^test result' "$OUT/routing.log" | tail -1)"
  [ -f "$D/mma" ] && "$D/mma" --test-threads=1 > "$OUT/mma.log" 2>&1 \
    && note "mma kernels: $(grep -E '^test result' "$OUT/mma.log" | tail -1)" \
    || note "mma kernels: FAILED $(grep -E '^test result|panicked' "$OUT/mma.log" | head -3)"
  REDLITE_PREFILL_TILES=0 "$D/kernels" --test-threads=1 matmul > "$OUT/kernels-tiles.log" 2>&1
  note "kernels, no token tiles: $(grep -E '^test result' "$OUT/kernels-tiles.log" | tail -1)"
  [ -f "$D/preload" ] && "$D/preload" --test-threads=1 > "$OUT/preload.log" 2>&1 \
    && note "weights loaded ahead, bit for bit: $(grep -E '^test result' "$OUT/preload.log" | tail -1)" \
    || note "weights loaded ahead: FAILED $(grep -E '^test result|panicked' "$OUT/preload.log" | head -3)"
  [ -f "$D/deltanet" ] && "$D/deltanet" --test-threads=1 --nocapture > "$OUT/deltanet.log" 2>&1 \
    && note "chunked delta rule, token-parallel conv: $(grep -E '^test result' "$OUT/deltanet.log" | tail -1)" \
    || note "chunked delta rule: FAILED $(grep -E '^test result|panicked' "$OUT/deltanet.log" | head -3)"
  [ -f "$D/attention" ] && "$D/attention" --test-threads=1 --nocapture > "$OUT/attention.log" 2>&1 \
    && note "flash prefill attention: $(grep -E '^test result' "$OUT/attention.log" | tail -1)" \
    || note "flash prefill attention: FAILED $(grep -E '^test result|panicked' "$OUT/attention.log" | head -3)"
fi

if stage preloadtest; then
  "$D/preload" --test-threads=1 > "$OUT/preload.log" 2>&1 \
    && note "weights loaded ahead, bit for bit: $(grep -E '^test result' "$OUT/preload.log" | tail -1)" \
    || note "weights loaded ahead: FAILED $(grep -E '^test result|panicked' "$OUT/preload.log" | head -3)"
fi

if stage parity; then
  stamp "parity tests"
  "$D/cuda_parity" --test-threads=1 --nocapture > "$OUT/parity.log" 2>&1
  note "cuda_parity: $(grep -E '^test result' "$OUT/parity.log" | tail -1)"
  note "  worst exact: $(grep -h 'Exact' "$OUT/parity.log" | sort -k8 -g | tail -1)"
  note "  worst q8:    $(grep -h 'Ggml' "$OUT/parity.log" | sort -k8 -g | tail -1)"
  [ -x "$D/cuda_mtp" ] && "$D/cuda_mtp" --test-threads=1 --nocapture > "$OUT/mtp-tests.log" 2>&1
  [ -x "$D/cuda_mtp" ] && note "cuda_mtp: $(grep -E '^test result' "$OUT/mtp-tests.log" | tail -1)"
  # The prompt kernels' alternatives (issue 7 wants both parity-tested).
  REDLITE_DELTA_CHUNKED=0 REDLITE_FLASH_PREFILL=0 REDLITE_PREFILL_GEMM=0 REDLITE_MMA_WIDE_TILES=0 \
    REDLITE_PREFILL_CUBLAS=0 \
    "$D/cuda_parity" --test-threads=1 --nocapture > "$OUT/parity-old.log" 2>&1
  note "cuda_parity, old prompt kernels: $(grep -E '^test result' "$OUT/parity-old.log" | tail -1)"
  REDLITE_PREFILL_CUBLAS=1 "$D/cuda_parity" --test-threads=1 --nocapture > "$OUT/parity-alt.log" 2>&1
  note "cuda_parity, cuBLAS from 16 tokens: $(grep -E '^test result' "$OUT/parity-alt.log" | tail -1)"
  note "  worst q8 (cuBLAS): $(grep -h 'Ggml' "$OUT/parity-alt.log" | sort -k8 -g | tail -1)"
  note "  worst exact (cuBLAS f32): $(grep -h 'Exact' "$OUT/parity-alt.log" | sort -k8 -g | tail -1)"
  # The decode kernels' alternatives (each switch's path against the CPU).
  for v in REDLITE_FUSED_DELTANET=0 REDLITE_ROUTER_TOPK=0 REDLITE_ROUTER_SHARED_ROW=0 \
      REDLITE_MOE_DOWN_PRELOAD=0; do
    env "$v" "$D/cuda_parity" --test-threads=1 --nocapture > "$OUT/parity-$v.log" 2>&1
    note "cuda_parity, $v: $(grep -E '^test result' "$OUT/parity-$v.log" | tail -1)"
  done
fi

if stage cache; then
  # The expert cache: bit for bit residency on tiny models (prefill, chunks, decode, graph;
  # LRU and LFU), both victim orders and the copies, the allocator's limit; then the full
  # Q4_K_M file's logits with a 16 GiB cache against residency, fed as a prompt, one token
  # at a time (decode: the copies inside the gate/up launch, and with the prefetch) and four
  # at a time (small batches).
  stamp "expert cache"
  "$D/cuda_expert_cache" --test-threads=1 --nocapture > "$OUT/cache-tests.log" 2>&1
  note "cuda_expert_cache: $(grep -E '^test result' "$OUT/cache-tests.log" | tail -1)"
  Q="$W/full-Q4_K_M.gguf"
  if [ -f "$Q" ] && [ "${CACHE_FULL:-1}" = 1 ]; then
    ids=$(seq -s, 11 37 2379)
    for chunk in 512 1 4; do
      for e in resident cache=16GiB cache=16GiB+prefetch; do
        [ "$e" = cache=16GiB+prefetch ] && [ "$chunk" != 1 ] && continue
        REDLITE_CACHE_PREFETCH=$([ "$e" = cache=16GiB+prefetch ] && echo 1 || echo 0) \
          "$R" logits -m "$Q" --device cuda --experts "${e%+prefetch}" --chunk "$chunk" \
          --tokens "$ids" --out "$W/logits-$e-$chunk.bin" > "$OUT/logits-$e-$chunk.log" 2>&1
        [ "$e" = resident ] && continue
        cmp -s "$W/logits-resident-$chunk.bin" "$W/logits-$e-$chunk.bin" && same=identical || same=DIFFERENT
        note "full Q4_K_M logits (64 tokens, chunk $chunk), $e vs resident: $same"
      done
    done
  fi
fi

if stage grouped; then
  # The grouped expert gate/up of prompts: bit for bit the per-pair launch (kernel test, and
  # the full model's logits after a 96-token prompt), and its speed (pp512, A/B).
  stamp "grouped experts"
  "$D/kernels" --test-threads=1 grouped > "$OUT/grouped-kernels.log" 2>&1
  note "grouped gate/up kernel test: $(grep -E '^test result' "$OUT/grouped-kernels.log" | tail -1)"
  ids=$(seq -s, 11 37 3563)
  for g in 1 0; do
    REDLITE_MOE_GROUPED=$g "$R" logits -m "$F" --device cuda --tokens "$ids" \
      --out "$W/logits-grouped$g.bin" > "$OUT/logits-grouped$g.log" 2>&1
  done
  cmp -s "$W/logits-grouped1.bin" "$W/logits-grouped0.bin" && same=identical || same=DIFFERENT
  note "full-model logits, grouped vs per-pair gate/up: $same"
  for g in 1 0; do
    note "REDLITE_MOE_GROUPED=$g: $(REDLITE_MOE_GROUPED=$g "$R" bench -m "$F" --device cuda -p 512,2048 \
      -n 0 -r 2 2>&1 | grep -E '^\| pp' | tr -s ' ' | tr '\n' ' ')"
  done
fi

if stage sanitize; then
  # compute-sanitizer's memcheck over the parity tests that cover every op (slow: a subset).
  stamp "compute-sanitizer"
  timeout "${SANITIZE_S:-240}" compute-sanitizer --tool memcheck --error-exitcode 9 "$D/cuda_parity" \
    --test-threads=1 decode_and_chunked_prefill_match_the_cpu a_multi_sequence_batch \
    > "$OUT/sanitizer.log" 2>&1
  note "memcheck (exit $?): $(grep -E 'ERROR SUMMARY|^test result' "$OUT/sanitizer.log" | tr '\n' ' ')"
fi

serve_check() {
  local name="$1"; shift
  env "$@" "$R" serve -m "$F" --device cuda --slots 4 --snapshots 0 --ctx 2048 --port 18080 \
    > "$OUT/serve-$name.log" 2>&1 &
  local pid=$!
  for _ in $(seq 180); do curl -sf http://127.0.0.1:18080/health > /dev/null && break; sleep 1; done
  timeout 120 python3 "$ROOT/scripts/device/serve_smoke.py" http://127.0.0.1:18080 8 32 \
    > "$OUT/serve-$name.txt" 2>&1
  kill -INT "$pid"; wait "$pid"
  note "serve ($name): $(grep -E 'equal to the request alone' "$OUT/serve-$name.txt")"
}
if stage serve; then
  stamp "serve"
  serve_check graph REDLITE_UNUSED=0
  serve_check no-graph REDLITE_CUDA_GRAPH=0
fi

if stage pairdrift; then
  # The per-pair prompt down reorders the routed sum: its drift on a full model's logits (the
  # Q4_K_M file when the offload stage wrote it, else the IQ2_XXS one).
  DRIFT_FILE="$W/full-Q4_K_M.gguf"; [ -f "$DRIFT_FILE" ] || DRIFT_FILE="$F"
  # The per-pair prompt down reorders the routed sum: its drift on the full model's logits.
  ids=$(seq -s, 11 37 3563)
  for pd in 1 0; do
    REDLITE_MOE_PAIR_DOWN=$pd "$R" logits -m "$DRIFT_FILE" --device cuda --tokens "$ids" \
      --out "$W/logits-pairdown$pd.bin" > "$OUT/logits-pairdown$pd.log" 2>&1
  done
  note "prompt logits, per-pair vs fused down: $(python3 "$ROOT/scripts/device/logits_drift.py" \
    "$W/logits-pairdown1.bin" "$W/logits-pairdown0.bin")"
fi

stage ab && stamp "redlite A/B"
tg() {
  env "$@" "$R" bench -m "$F" --device cuda -p 512 -n 128 -d 0 -r 2 2>&1 | grep -E '^\| (pp|tg)' \
    | tr -s ' ' | tr '\n' ' '
}
if stage ab; then
  note "defaults:               $(tg REDLITE_UNUSED=0)"
  note "no token tiles:         $(tg REDLITE_PREFILL_TILES=0)"
  note "fused prompt down:      $(tg REDLITE_MOE_PAIR_DOWN=0)"
  note "exact (f32 activations): $(tg REDLITE_CUDA_EXACT=1)"
fi

if stage decode; then
  # Issue 6: decode with the defaults and the switches in DECODE_AB (tg128 at depth 0 and
  # 4096), then Nsight Compute's kernel durations over graph-replayed decode steps, caches
  # left warm (the kernels' own time per token, against the token's wall time), and the
  # stall sections of the three largest decode kernels.
  stamp "decode A/B"
  dec() {
    env "$@" "$R" bench -m "$F" --device cuda -p 0 -n 128 -d 0,4096 -r "${DECODE_R:-3}" 2>&1 \
      | grep -E '^\| tg' | tr -s ' ' | tr '\n' ' '
  }
  for v in REDLITE_UNUSED=0 ${DECODE_AB:-}; do
    line="$(dec "$v")"; note "decode $v: $line"
    echo "$v $(echo "$line" | sed -n 's/^| tg128 | \([0-9.]*\).*/\1/p')" >> "$W/decode-ab.txt"
  done
  # A switch that beats the defaults' tg128 by more than 1 % is kept for the compare stage
  # of this machine (a later call while it is warm), and said so.
  python3 - "$W/decode-ab.txt" > "$W/compare.env" <<'PY'
import sys
rows = [l.split() for l in open(sys.argv[1]) if len(l.split()) == 2]
base = next((float(v) for k, v in rows if k == "REDLITE_UNUSED=0"), None)
for k, v in rows:
    if base and k != "REDLITE_UNUSED=0" and k.endswith("=1") and float(v) > 1.01 * base:
        print(f"export {k}")
PY
  note "switches kept for the comparison: $(cat "$W/compare.env" | tr '\n' ' ')"
  # DRIFT_SWITCH (switches, space-separated): the decode path's logits (one-token steps) with
  # each against the defaults (a switch that keeps the sums: identical).
  if [ -n "${DRIFT_SWITCH:-}" ]; then
    ids=$(seq -s, 11 37 1200)
    for v in REDLITE_UNUSED=0 $DRIFT_SWITCH; do
      env "$v" "$R" logits -m "$F" --device cuda --chunk 1 --tokens "$ids" \
        --out "$W/logits-decode-$v.bin" > "$OUT/logits-decode-$v.log" 2>&1
    done
    for v in $DRIFT_SWITCH; do
      note "decode logits, $v vs default: $(python3 "$ROOT/scripts/device/logits_drift.py" \
        "$W/logits-decode-REDLITE_UNUSED=0.bin" "$W/logits-decode-$v.bin")"
    done
  fi
  if [ "${NCU:-1}" = 1 ] && command -v ncu > /dev/null; then
    # NCU_ENVS: the kernel durations with each of these settings (default: the defaults).
    for v in ${NCU_ENVS:-REDLITE_UNUSED=0}; do
      env "$v" timeout 200 ncu --clock-control none --cache-control none --graph-profiling node \
        --metrics gpu__time_duration.sum --csv --print-units base --launch-skip 3000 \
        --launch-count "${NCU_LAUNCHES:-1500}" "$R" bench -m "$F" --device cuda -p 0 -n 16 -r 1 \
        > "$OUT/ncu-decode-$v.csv" 2> "$OUT/ncu-decode-$v.err"
      python3 "$ROOT/scripts/device/ncu_kernels.py" "$OUT/ncu-decode-$v.csv" embed_kernel \
        > "$OUT/ncu-decode-$v.txt" 2>&1
      note "ncu, $v:"; head -25 "$OUT/ncu-decode-$v.txt" | tee -a "$SUMMARY"
    done
  fi
  if [ "${NCU_SECTIONS:-1}" = 1 ] && [ "${NCU:-1}" = 1 ] && command -v ncu > /dev/null; then
    sections=(--section SpeedOfLight --section Occupancy --section LaunchStats
      --section WarpStateStats --section MemoryWorkloadAnalysis --section SchedulerStats)
    for k in ${NCU_KERNELS:-matmul_q8_kernel moe_gate_up_q8_kernel moe_down_q8_preload_kernel}; do
      timeout 120 ncu --clock-control none --cache-control none --graph-profiling node \
        -k "regex:$k" --launch-skip 60 --launch-count 3 "${sections[@]}" \
        "$R" bench -m "$F" --device cuda -p 0 -n 8 -r 1 > "$OUT/ncu-$k.txt" 2>&1
      note "ncu $k: $(grep -E 'matmul|moe_|Duration|Throughput|Achieved Occupancy|Registers Per|Issued Ipc|No Eligible|Block Limit|Grid Size|Waves' "$OUT/ncu-$k.txt" | head -30 | tr -s ' ' | tr '\n' ';')"
    done
  fi
fi

if stage profile; then
  stamp "profile"
  "$R" bench -m "$F" --device cuda -p 512 -n 32 -r 1 --profile > "$OUT/profile.txt" 2>&1
  note "bench --profile (pp512, tg32 eager):"; grep -E '^(profile|  )' "$OUT/profile.txt" | tee -a "$SUMMARY"
fi

stage mtp && stamp "MTP"
mtp_bench() {
  "$R" bench -m "$M" --device cuda -p 0 -n 128 -r 2 "$@" 2>&1 | grep -E '^\| tg' | tr -s ' '
}
if stage mtp; then
  note "MTP on the full file, forced acceptance (each run times plain decoding first):"
  { mtp_bench --mtp --draft 1 --mtp-accept 0,0.7,1; mtp_bench --mtp --draft 3 --mtp-accept 0.7,1; } \
    | tee -a "$SUMMARY"
fi

# The trained demo model: the embedded default, and any file carried in .cache/demo-gpu: greedy
# text with and without MTP, real acceptance and speed, and the same text as the CPU.
stage demo && for f in default "$ROOT"/.cache/demo-gpu/*.gguf; do
  [ "$f" = default ] || [ -f "$f" ] || continue
  name="$(basename "$f" .gguf)"
  model=(); [ "$f" = default ] || model=(-m "$f")
  run_demo() {
    REDLITE_CACHE="$W/cache" "$R" generate "${model[@]}" -p "And God said, Let there be light" \
      -n 256 --temp 0 "$@" > "$OUT/$name-$*.txt" 2> "$OUT/$name-$*.err"
  }
  run_demo --device cpu; run_demo --device cuda; run_demo --device cuda --mtp
  run_demo --device cuda --mtp --draft 3
  same() { cmp -s "$OUT/$name-$1.txt" "$OUT/$name-$2.txt" && echo same || echo DIFFERENT; }
  note "$name: gpu text vs cpu $(same '--device cpu' '--device cuda'); mtp vs plain \
$(same '--device cuda' '--device cuda --mtp'), draft 3 $(same '--device cuda' '--device cuda --mtp --draft 3')"
  for v in '--device cuda' '--device cuda --mtp' '--device cuda --mtp --draft 3'; do
    note "  $v: $(grep -hE 'generated|mtp:' "$OUT/$name-$v.err" | tr '\n' ' ')"
  done
done

if stage compare; then
  stamp "same-run comparison"
  [ -f "$W/compare.env" ] && . "$W/compare.env" && note "compare with: $(cat "$W/compare.env" | tr '\n' ' ')"
  RECIPE=IQ2_XXS ROUNDS=1 PP="${COMPARE_PP:-512,2048,8192}" bash "$S" bench > "$OUT/vs-IQ2_XXS.txt" 2>&1
  RECIPE=IQ1_M ROUNDS=1 DEPTHS=0 PP=512,2048 OUT="$OUT/iq1m" bash "$S" bench > "$OUT/vs-IQ1_M.txt" 2>&1
  note ""; note "IQ2_XXS, llama.cpp and redlite in the same run:"; grep -E '^\|' "$OUT/vs-IQ2_XXS.txt" | tee -a "$SUMMARY"
  note ""; note "IQ1_M:"; grep -E '^\|' "$OUT/vs-IQ1_M.txt" | tee -a "$SUMMARY"
fi
if stage mmaab; then
  # Prompt speed with and without the tensor-core products (resident, no limit).
  AB_FILE="$W/full-Q4_K_M.gguf"; [ -f "$AB_FILE" ] || AB_FILE="$F"
  for m in 1 0; do
    note "$(basename "$AB_FILE") REDLITE_PREFILL_MMA=$m: $(REDLITE_PREFILL_MMA=$m "$R" bench -m "$AB_FILE" \
      --device cuda -p 512,2048 -n 0 -r 2 2>&1 | grep -E '^\| pp' | tr -s ' ' | tr '\n' ' ')"
  done
  "$R" bench experts -m "$AB_FILE" > "$OUT/bench-experts.json" 2>&1
  note "bench experts: $(head -c 1500 "$OUT/bench-experts.json" | tr -s ' \n' ' ')"
fi

if stage prefill; then
  # Issue 7: the prompt kernels against their switches (pp512 / 2048 / 8192; PREFILL_AB: the
  # switches, one run each), with PREFILL_EXTRA=1 also bench experts and our dense prompt
  # products per shape against cuBLAS.
  stamp "prefill A/B"
  pp() {
    env "$@" "$R" bench -m "$F" --device cuda -p "${PREFILL_PP:-512,2048,8192}" -n 0 -r 2 2>&1 \
      | grep -E '^\| pp' | tr -s ' ' | tr '\n' ' '
  }
  for v in REDLITE_UNUSED=0 ${PREFILL_AB:-REDLITE_PREFILL_CUBLAS=0 REDLITE_MMA_WIDE_TILES=0 \
      REDLITE_PREFILL_GEMM=0 REDLITE_DELTA_CHUNKED=0 REDLITE_FLASH_PREFILL=0}; do
    note "$v: $(pp "$v")"
  done
fi
if stage prefill && [ "${PREFILL_EXTRA:-1}" = 1 ]; then
  "$R" bench experts -m "$F" -r 3 > "$OUT/experts.json" 2>&1
  note "bench experts: $(head -c 600 "$OUT/experts.json" | tr -s ' \n' ' ')"
  # Our dense prompt kernels per shape (synchronized launches) against cuBLAS at the same shapes.
  REDLITE_CUDA_PROFILE=1 "$R" bench -m "$F" --device cuda -p 512,2048 -n 0 -r 1 \
    > /dev/null 2> "$OUT/kernel-profile.txt"
  python3 "$ROOT/scripts/device/cublas_shapes.py" "$OUT/kernel-profile.txt" > "$OUT/cublas.txt" 2>&1
  note "dense prompt products, ours vs cuBLAS (GEMM alone):"; tee -a "$SUMMARY" < "$OUT/cublas.txt"
  REDLITE_PREFILL_CUBLAS=1 REDLITE_CUDA_PROFILE=1 "$R" bench -m "$F" --device cuda -p 512 -n 0 -r 1 \
    > /dev/null 2> "$OUT/kernel-profile-cublas.txt"
  note "the cuBLAS path in redlite (REDLITE_PREFILL_CUBLAS=1, pp512, synchronized):"
  grep -E 'cublas|dequantize_f16|to_f16|cuda profile' "$OUT/kernel-profile-cublas.txt" | head -20 | tee -a "$SUMMARY"
fi

if stage ncu && command -v ncu > /dev/null; then
  # Where the two largest prompt kernels stall (pp512): the tensor-core expert products
  # (bench experts, layer 0) and the chunked delta rule (a 512-token prompt).
  stamp "ncu"
  sections=(--section SpeedOfLight --section Occupancy --section LaunchStats
    --section WarpStateStats --section MemoryWorkloadAnalysis --section SchedulerStats)
  timeout 150 ncu --clock-control none -k regex:mma_matmul --launch-skip 4 --launch-count 2 \
    "${sections[@]}" "$R" bench experts -m "$F" -r 1 > "$OUT/ncu-mma.txt" 2>&1
  timeout 150 ncu --clock-control none -k regex:delta_chunked --launch-skip 36 --launch-count 1 \
    "${sections[@]}" "$R" bench -m "$F" --device cuda -p 512 -n 0 -r 1 > "$OUT/ncu-delta.txt" 2>&1
  for f in mma delta; do
    note "ncu $f: $(grep -E '_kernel|Duration|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Issued Ipc|No Eligible|Stall|Block Limit' "$OUT/ncu-$f.txt" | head -40 | tr -s ' ' | tr '\n' ';')"
  done
fi

if stage offload; then
  stamp "offload: llama.cpp --n-cpu-moe vs the expert cache"
  # OFFLOAD_ROUTES: the synthetic file's own routing (natural), uniform (the cache's worst
  # case) and/or the published skew (skew: REDLITE_BENCH_ROUTE_SKEW=SKEW_DECAY); redlite only.
  for route in ${OFFLOAD_ROUTES:-natural uniform}; do
    case "$route" in
      natural) routing=(SPREAD=0 REDLITE_BENCH_ROUTE_SKEW=0) ;;
      uniform) routing=(SPREAD=1 REDLITE_BENCH_ROUTE_SKEW=0) ;;
      skew) routing=(SPREAD=0 REDLITE_BENCH_ROUTE_SKEW="${SKEW_DECAY:-0.22}") ;;
      *) note "offload: unknown route $route (natural, uniform or skew)"; continue ;;
    esac
    env "${routing[@]}" RECIPE=Q4_K_M LIMIT=24GiB NCMOE="${NCMOE:-26}" bash "$O" bench \
      > "$OUT/offload-Q4_K_M-$route.txt" 2>&1
    note ""; note "routing: $route, cache policy ${REDLITE_CACHE_POLICY:-default}"
    grep -E '^(\||Q4_K_M)' "$OUT/offload-Q4_K_M-$route.txt" | tee -a "$SUMMARY"
  done
fi
if stage skew; then
  # Issue 8: the expert cache under uniform routing (REDLITE_BENCH_ROUTE_SPREAD=1, its worst
  # case) and under the skew measured on Qwen3-30B-A3B (REDLITE_BENCH_ROUTE_SKEW=0.22,
  # docs/CUDA.md), each with LRU and LFU replacement (REDLITE_CACHE_POLICY): bench pp512 and
  # tg64 of the IQ2_XXS file at --gpu-limit 16GiB (a cache of about 378 of 512 experts per
  # layer). Neither routing is the model's: both replace the router's choice. The uniform runs
  # recompile the kernels (the spread is a compile option; NVRTC's disk cache keeps both).
  # Results stay in $W (kept while the machine is warm), so the runs can be split over calls.
  # SKEW_LAYERS=N: a file of the full model's shapes with N layers instead (the page-locked
  # copy and the warm-up shrink with it; hit rates and bytes a layer are what a policy changes),
  # with SKEW_EXPERTS (e.g. cache=3540MiB: the same 378 of 512 slots a layer for 12 layers).
  SF="$F"; where=(--gpu-limit "${SKEW_LIMIT:-16GiB}")
  if [ -n "${SKEW_LAYERS:-}" ]; then
    SF="$W/full-IQ2_XXS-L$SKEW_LAYERS.gguf"
    [ -f "$SF" ] || "$R" synth "$SF" --preset full --recipe IQ2_XXS --layers "$SKEW_LAYERS" 2>&1 | tail -1
    where=(--experts "${SKEW_EXPERTS:-cache=3540MiB}")
  fi
  stamp "expert cache: routing x replacement"
  for run in ${SKEW_RUNS:-uniform-lru uniform-lfu skew-lru skew-lfu}; do
    case "$run" in
      uniform-*) routing=(REDLITE_BENCH_ROUTE_SPREAD=1 REDLITE_BENCH_ROUTE_SKEW=0) ;;
      skew-*) routing=(REDLITE_BENCH_ROUTE_SPREAD=0 REDLITE_BENCH_ROUTE_SKEW="${SKEW_DECAY:-0.22}") ;;
      *) note "skew: unknown run $run (expected uniform-lru, uniform-lfu, skew-lru or skew-lfu)"; continue ;;
    esac
    timeout "${SKEW_TIMEOUT_S:-300}" env "${routing[@]}" REDLITE_CACHE_POLICY="${run#*-}" \
      "$R" bench -m "$SF" --device cuda "${where[@]}" -p 512 -n 64 -r 1 \
      --json > "$W/skew-$run.json" 2> "$OUT/skew-$run.log"
    note "skew $run: exit $? after $SECONDS s"
  done
  note "expert cache, ${where[*]} ($(basename "$SF"); uniform: REDLITE_BENCH_ROUTE_SPREAD=1, skew: REDLITE_BENCH_ROUTE_SKEW=${SKEW_DECAY:-0.22}; neither is the model's routing):"
  python3 - "$W" <<'PY' | tee -a "$SUMMARY"
import json, os, sys
print("| routing | policy | pp512 t/s | pp hit rate | pp MiB/token | tg64 t/s | tg hit rate | tg MiB/token | tg layer hit rates |")
print("|---|---|---|---|---|---|---|---|---|")
for run in ("uniform-lru", "uniform-lfu", "skew-lru", "skew-lfu"):
    path = os.path.join(sys.argv[1], f"skew-{run}.json")
    if not os.path.exists(path):
        continue
    routing, policy = run.split("-")
    try:
        results = {r["test"].split()[0][:2]: r for r in json.load(open(path))["results"]}
    except Exception as e:
        print(f"| {routing} | {policy} | no result ({type(e).__name__}: cut off or failed, see skew-{run}.log) |")
        continue
    cells = []
    for test in ("pp", "tg"):
        r = results.get(test)
        c = (r or {}).get("expert_cache")
        if not r:
            cells += ["-", "-", "-"]
        elif not c:
            cells += [f"{r['avg_ts']:.1f}", "resident", "0"]
        else:
            cells += [f"{r['avg_ts']:.1f}", f"{100 * c['hit_rate']:.1f} %", f"{c['bytes_per_token'] / 2**20:.1f}"]
    layers = ((results.get("tg") or {}).get("expert_cache") or {}).get("layer_hit_rates") or []
    spread = f"{100 * min(layers):.0f}-{100 * max(layers):.0f} %" if layers else "-"
    print(f"| {routing} | {policy} | " + " | ".join(cells) + f" | {spread} |")
PY
fi
stamp "done"
tar czf "$RESULTS/logs.tgz" -C "$OUT" .
echo; echo "== summary"; cat "$SUMMARY"
