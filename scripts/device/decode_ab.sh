#!/usr/bin/env bash
# On the GPU machine, one call: decode switches checked for bits and measured on the full
# synthetic IQ2_XXS+MTP file. In order:
#   1. bits: `redlite logits` over 24 tokens fed one and four at a time (decode and
#      small-batch graphs) with each switch of BITS_AB against the defaults (`cmp`, and the
#      drift where they differ);
#   2. GPU tests (TESTS, default: q8_input, the quantizing norms and the q8 products reading
#      their codes bit for bit; cuda_mtp, every verification row the bits of a plain step;
#      cuda_serve, batched serving with and without MTP against each request alone) under
#      each setting of TEST_AB (default: the defaults alone);
#   3. tg128 at depth 0 (and 4096 for the first two settings) with the defaults and each
#      setting of DECODE_AB, one process each, then every setting 0.5 % or more above the
#      defaults at depth 0 together (depths 0 and 4096); then the host clocks of a replayed
#      step (REDLITE_STEP_TIMES), with the early graph launch (the default) and without;
#   4. MTP: `bench --mtp --draft K --mtp-accept 0.7,1` for each K of MTP_DRAFTS (1 3), with the
#      defaults and each setting of MTP_AB;
#   4a. (stage clocks, not by default) the host clocks of chained MTP steps (REDLITE_STEP_TIMES)
#      for each K of MTP_DRAFTS;
#   4b. (stage temp, not by default) tg128 with tokens sampled at temperature 0.8 (`bench --temp`),
#      plain and with each K of MTP_DRAFTS at 0.7 and 1, under the defaults and each setting of
#      TEMP_AB (default: REDLITE_MTP_ARGMAX_DRAFTS=1);
#   4c. (stage pp, not by default) prompts of PP_SIZES (512,2048) under the defaults and each of
#      PP_AB, the defaults again last;
#   5. batches of 1 to 4 tokens (`bench -p 1,2,3,4`) with the defaults and each of SMALL_AB;
#   5a. (stage probes, not by default) tg128 under each REDLITE_PROBE_EXIT mask of PROBES;
#   6. (stage profile, not by default) Nsight Compute's duration of every kernel of ~2.5
#      replayed decode tokens, by kernel and grid size (which product shapes cost what);
#   6a. (stage timeline, not by default) REDLITE_TIMELINE=1 at each of TIMELINE_DEPTHS
#      (default 0 4096; empty: none), then MTP steps of each of TIMELINE_DRAFTS drafts (default
#      1) at acceptance 0.7: per kernel, its share of a replayed step on the critical path and
#      how early its CTAs were resident (programmatic dependent launch's overlap);
#   7. (stage stalls, not by default) Nsight Compute's throughput, occupancy, warp-state,
#      memory and source-counter sections for one decode launch of each kernel of
#      STALL_KERNELS (why a product of a few MB takes ~10 µs: the stall reasons, the bytes
#      in flight), with the stall samples per SASS instruction as CSV.
# Carry .cache/device/redlite.xz and the test binaries named in TESTS (scripts/device/prepare.sh).
#
#   bash scripts/device/decode_ab.sh
#
# Env: the settings BITS_AB, TEST_AB, DECODE_AB, MTP_AB, SMALL_AB, PROFILE_AB (space-separated, each
# VAR=value or several joined by +: A=1+B=1); AB_DEPTHS (the depths of DECODE_AB's settings after
# the first, default 0); TEMP_AB (stage temp); PROBES; PROFILE_DEPTH, PROFILE_KERNELS (a regex), PROFILE_SKIP,
# PROFILE_COUNT (the profile at a depth, of some kernels); BENCH_EXTRA (more arguments of the
# decode stage's benches, e.g. `--kv f16`); PROFILE_ARGS (the profiled bench's
# arguments instead of `-p 0 -n 16 -d PROFILE_DEPTH -r 1`, e.g. `--mtp --draft 1 --mtp-accept 1`
# for the verification's kernels); STALL_KERNELS (regexes of
# kernel names), STALL_CHUNK, STALL_TOKENS; TIMELINE_DEPTHS; STAGES (bits tests decode mtp
# small; also clocks temp pp probes profile timeline stalls rows replay); ROWS_CHUNKS, ROWS_BATCHES, ROWS_SKIP
# (stage rows); PP_AB, PP_SIZES (stage pp); OUT.
# This build against an earlier one: scripts/device/vs_base.sh.
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
D="$ROOT/.cache/device"; W=/tmp/rl; OUT="${OUT:-$W/results}"
mkdir -p "$W" "$OUT" "$ROOT/target/release"
STAGES=" ${STAGES:-bits tests decode mtp small} "; stage() { [[ "$STAGES" == *" $1 "* ]]; }
BITS_AB="${BITS_AB:-}"; DECODE_AB="${DECODE_AB:-}"; SMALL_AB="${SMALL_AB:-}"; TEST_AB="${TEST_AB:-REDLITE_UNUSED=0}"
R="$ROOT/target/release/redlite"; M="$W/full-IQ2_XXS-mtp.gguf"
SUMMARY="$OUT/summary.txt"
export LD_LIBRARY_PATH="/usr/local/cuda-13.0/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}"
# shellcheck source=scripts/device/common.sh
source "$ROOT/scripts/device/common.sh"
python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
  "$D/redlite.xz" "$R" && chmod +x "$R"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$SUMMARY"
[ -f "$M" ] || "$R" synth "$M" --preset full --recipe IQ2_XXS --mtp 2>&1 | tail -1 | tee -a "$SUMMARY"

if stage bits; then
  stamp "bits on the full file"
  tokens="$(python3 -c 'print(",".join(str((i * 7919 + 13) % 150000) for i in range(24)))')"
  logits() {  # name chunk settings...
    local name="$1" chunk="$2"; shift 2
    env "$@" "$R" logits -m "$M" --device cuda --chunk "$chunk" --tokens "$tokens" \
      --out "$W/$name-$chunk.f32" > "$OUT/logits-$name-$chunk.log" 2>&1 \
      || tail -3 "$OUT/logits-$name-$chunk.log"
  }
  same() { cmp -s "$1" "$2" && echo "same bits" || echo "DIFFERENT"; }
  for chunk in 1 4; do logits defaults "$chunk" REDLITE_UNUSED=0; done
  note "defaults, chunk 4 vs chunk 1: $(same "$W/defaults-1.f32" "$W/defaults-4.f32")"
  # A setting that changes bits: its drift, the worst relative L2 per position and how many
  # positions keep their argmax (random weights amplify any rounding over 48 layers).
  drift() {
    python3 - "$1" "$2" <<'PY'
import array, math, sys
a, b = (array.array("f", open(p, "rb").read()) for p in sys.argv[1:3])
vocab = 151936
if len(a) != len(b) or len(a) % vocab:
    print("lengths differ"); sys.exit()
rows = range(0, len(a), vocab)
worst = max(math.sqrt(sum((x - y) ** 2 for x, y in zip(a[i:i + vocab], b[i:i + vocab])))
            / max(math.sqrt(sum(x * x for x in a[i:i + vocab])), 1e-30) for i in rows)
kept = sum(max(range(vocab), key=lambda j: a[i + j]) == max(range(vocab), key=lambda j: b[i + j])
           for i in rows)
print(f"worst rel L2 per position {worst:.3e}, argmax kept {kept}/{len(rows)}")
PY
  }
  for v in $BITS_AB; do
    for chunk in 1 4; do
      name="${v//[=+]/_}"
      logits "$name" "$chunk" ${v//+/ }
      result="$(same "$W/defaults-$chunk.f32" "$W/$name-$chunk.f32")"
      [ "$result" = DIFFERENT ] && result="$result: $(drift "$W/defaults-$chunk.f32" "$W/$name-$chunk.f32")"
      note "$v vs defaults, chunk $chunk: $result"
    done
  done
fi

if stage tests; then
  for v in $TEST_AB; do  # the tests under each setting, logs in a folder of its own
    note "tests under $v"
    # shellcheck disable=SC2086
    ( export ${v//+/ }; OUT="$OUT/tests-${v//[=+]/_}"; mkdir -p "$OUT"
      run_tests "$D" ${TESTS:-q8_input cuda_mtp cuda_serve} )
  done
fi

if stage decode; then
  stamp "decode A/B"
  dec() {  # depths settings...
    local depths="$1"; shift
    # shellcheck disable=SC2086
    env "$@" "$R" bench -m "$M" --device cuda -p 0 -n 128 -d "$depths" -r 3 ${BENCH_EXTRA:-} 2>&1 \
      | grep -E '^\| tg' | tr -s ' ' | tr '\n' ' '
  }
  tg0() { grep -oE 'tg128 \| [0-9.]+' <<< "$1" | head -1 | awk '{print $3}'; }
  line="$(dec 0,4096 REDLITE_UNUSED=0)"; note "defaults: $line"; base="$(tg0 "$line")"
  first=1; winners=()
  for v in $DECODE_AB; do
    depths="${AB_DEPTHS:-0}"; [ "$first" = 1 ] && depths=0,4096; first=0
    line="$(dec "$depths" ${v//+/ })"; note "$v: $line"
    # A setting 0.5 % or more above the defaults at depth 0 joins the combination below.
    python3 -c 'import sys; sys.exit(0 if float(sys.argv[1]) >= 1.005 * float(sys.argv[2]) else 1)' \
      "$(tg0 "$line")" "$base" 2> /dev/null && winners+=("${v//+/ }")
  done
  note "defaults again: $(dec 0 REDLITE_UNUSED=0)"
  if [ "${#winners[@]}" -gt 1 ]; then
    # shellcheck disable=SC2068
    combo="$(tr ' ' '\n' <<< "${winners[*]}" | sort -u | tr '\n' ' ')"
    # shellcheck disable=SC2086
    note "the winners together ($combo): $(dec 0,4096 $combo)"
  fi
  # The host's share of a replayed step (REDLITE_STEP_TIMES), with and without the early launch.
  for v in REDLITE_UNUSED=0 REDLITE_GRAPH_EARLY_LAUNCH=0; do
    note "host clocks, $v: $(env "$v" REDLITE_STEP_TIMES=1 "$R" bench -m "$M" --device cuda -p 0 -n 128 -r 1 2>&1 \
      | grep -E '^step times|^\| tg' | tr -s ' ' | tr '\n' ' ')"
  done
fi

if stage probes; then
  # REDLITE_PROBE_EXIT masks (docs/CUDA.md): tg128 with the kernels of each family emptied, the
  # plain build first and last; each mask compiles only its families again.
  stamp "probes"
  for m in ${PROBES:-0 1 2 4 8 16 32 512 768 255 0}; do
    note "probe $m: $(REDLITE_PROBE_EXIT=$m "$R" bench -m "$M" --device cuda -p 0 -n 128 -r 2 2>&1 \
      | grep -E '^\| tg' | tr -s ' ')"
  done
fi
if stage mtp; then
  stamp "MTP bench"
  for v in REDLITE_UNUSED=0 ${MTP_AB:-}; do
    for k in ${MTP_DRAFTS:-1 3}; do
      name="${v//[=+]/_}-draft$k"
      # shellcheck disable=SC2086
      env ${v//+/ } "$R" bench -m "$M" --device cuda -p 0 -n 128 -r 2 --mtp --draft "$k" \
        --mtp-accept 0.7,1 > "$OUT/bench-$name.txt" 2>&1
      note "$v, draft $k: $(grep -E '^\| tg|verify' "$OUT/bench-$name.txt" | tr -s ' ' | tr '\n' ' ')"
    done
  done
fi
if stage clocks; then
  # The host's side of chained MTP steps (REDLITE_STEP_TIMES=1, step_clocks.rs): each replayed
  # step's upload, launch, walk and wait, and the gap from its picks to the next step's start,
  # for each K of MTP_DRAFTS at acceptance 0.7 and 1.
  stamp "MTP step clocks"
  for k in ${MTP_DRAFTS:-1 3}; do
    note "clocks, draft $k: $(REDLITE_STEP_TIMES=1 "$R" bench -m "$M" --device cuda -p 0 -n 128 -r 2 \
      --mtp --draft "$k" --mtp-accept 0.7,1 2>&1 | grep -E '^\| tg|step times|step graphs' \
      | tr -s ' ' | tr '\n' ' ')"
  done
fi
if stage temp; then
  # Tokens sampled as a chat samples them (`bench --temp 0.8`: the logits read every token, top-k
  # 40, top-p, min-p), plain and with each K of MTP_DRAFTS at 0.7 and 1, under the defaults and
  # each setting of TEMP_AB (default: REDLITE_MTP_ARGMAX_DRAFTS=1, the drafts the block's
  # largest logits inside the chained step instead of sampled on the host between the drafts);
  # the fixed tokens' tg128 first for the comparison.
  stamp "sampled tokens"
  note "fixed tokens: $("$R" bench -m "$M" --device cuda -p 0 -n 128 -r 3 2>&1 | grep -E '^\| tg' | tr -s ' ')"
  for v in REDLITE_UNUSED=0 ${TEMP_AB:-REDLITE_MTP_ARGMAX_DRAFTS=1}; do
    for k in ${MTP_DRAFTS:-1 3}; do
      # shellcheck disable=SC2086
      note "temp 0.8, $v, draft $k: $(env ${v//+/ } "$R" bench -m "$M" --device cuda -p 0 -n 128 \
        -r 3 --temp 0.8 --mtp --draft "$k" --mtp-accept 0.7,1 2>&1 | grep -E '^\| tg' | tr -s ' ' \
        | tr '\n' ' ')"
    done
  done
fi
if stage pp; then
  # Prompt ingestion (the int8 tensor-core products) under the defaults and each of PP_AB,
  # then the defaults again.
  stamp "prompts"
  for v in REDLITE_UNUSED=0 ${PP_AB:-} REDLITE_UNUSED=0; do
    # shellcheck disable=SC2086
    note "pp $v: $(env ${v//+/ } "$R" bench -m "$M" --device cuda -p "${PP_SIZES:-512,2048}" -n 0 \
      -r 3 2>&1 | grep -E '^\| pp' | tr -s ' ' | tr '\n' ' ')"
  done
fi
if stage small; then
  stamp "batches of 1 to 4 tokens"
  for v in REDLITE_UNUSED=0 $SMALL_AB; do
    env "$v" "$R" bench -m "$M" --device cuda -p 1,2,3,4 -n 0 -r 20 > "$OUT/small-${v//=/_}.txt" 2>&1
    note "pp1..4 $v: $(grep -E '^\| pp' "$OUT/small-${v//=/_}.txt" | tr -s ' ' | tr '\n' ' ')"
  done
fi
if stage timeline; then
  # REDLITE_TIMELINE=1 (docs/CUDA.md): every launch's first CTA clocks its wait; the report
  # (per kernel: launches, its share of a step from its release to the next release, how
  # early its first CTA was resident) at the process's end, one process a depth so that the
  # rings hold that depth's steps only. The option compiles every module again (~2 min).
  stamp "timeline"
  for d in ${TIMELINE_DEPTHS-0 4096}; do
    REDLITE_TIMELINE=1 "$R" bench -m "$M" --device cuda -p 0 -n 64 -d "$d" -r 1 ${BENCH_EXTRA:-} \
      > "$OUT/timeline-d$d.txt" 2>&1
    note "timeline at depth $d: $(grep -E '^\| tg' "$OUT/timeline-d$d.txt" | tr -s ' ')"
    grep -A 25 '^timeline:' "$OUT/timeline-d$d.txt" | tee -a "$SUMMARY"
  done
  # Drafts of TIMELINE_DRAFTS (default 1) at acceptance 0.7 (bench times plain decoding first;
  # the rings keep the MTP steps, each ending with the verification's LM head: timeline.rs):
  # what a step's graphs and the host leave idle, and each kernel's share of a verification of
  # several rows.
  for k in ${TIMELINE_DRAFTS:-1}; do
    REDLITE_TIMELINE=1 "$R" bench -m "$M" --device cuda -p 0 -n 64 -r 1 --mtp --draft "$k" \
      --mtp-accept 0.7 ${BENCH_EXTRA:-} > "$OUT/timeline-mtp$k.txt" 2>&1
    note "timeline, MTP draft $k: $(grep -E '^\| tg|verify' "$OUT/timeline-mtp$k.txt" | tr -s ' ' | tr '\n' ' ')"
    grep -A 40 '^timeline:' "$OUT/timeline-mtp$k.txt" | tee -a "$SUMMARY"
  done
fi
if stage profile && command -v ncu > /dev/null; then
  # One metric, L2 left as the previous kernel left it (what a decode step sees); the first
  # 3000 launches (the graph's recording, cold caches) skipped. PROFILE_AB: settings
  # profiled after the defaults.
  for v in REDLITE_UNUSED=0 ${PROFILE_AB:-}; do
    stamp "ncu: every kernel of ~2.5 decode tokens by grid size, $v"
    name="${v//[=+]/_}"
    # shellcheck disable=SC2086
    filter=(); [ -n "${PROFILE_KERNELS:-}" ] && filter=(--kernel-name "regex:$PROFILE_KERNELS")
    env ${v//+/ } timeout 300 ncu --clock-control none --cache-control none \
      --graph-profiling node --metrics gpu__time_duration.sum --csv --print-units base \
      "${filter[@]}" --launch-skip "${PROFILE_SKIP:-3000}" --launch-count "${PROFILE_COUNT:-1500}" \
      "$R" bench -m "$M" --device cuda ${PROFILE_ARGS:--p 0 -n 16 -d ${PROFILE_DEPTH:-0} -r 1} \
      > "$OUT/ncu-decode-$name.csv" 2> "$OUT/ncu-decode-$name.err" \
      || tail -3 "$OUT/ncu-decode-$name.err"
    python3 "$ROOT/scripts/device/ncu_kernels.py" "$OUT/ncu-decode-$name.csv" embed_kernel \
      --by-grid > "$OUT/ncu-decode-by-grid-$name.txt" 2>&1
    head -16 "$OUT/ncu-decode-by-grid-$name.txt" | tee -a "$SUMMARY"
  done
fi
if stage rows && command -v ncu > /dev/null; then
  # Nsight Compute's duration of every kernel of batches of ROWS_CHUNKS rows (default 1 and 4:
  # a decode step against a three-draft verification's batch), `logits --chunk C` over
  # ROWS_TOKENS tokens, the first ROWS_SKIP batches' launches left out (recording, cold
  # caches); per batch by kernel and grid. Serialized launches: no PDL overlap.
  for c in ${ROWS_CHUNKS:-1 4}; do
    stamp "ncu: every kernel of batches of $c rows"
    n_tokens=$(( c * ${ROWS_BATCHES:-8} ))
    tokens="$(python3 -c 'import sys; print(",".join(str((i * 7919 + 13) % 150000) for i in range(int(sys.argv[1]))))' "$n_tokens")"
    timeout 300 ncu --clock-control none --cache-control none \
      --graph-profiling node --metrics gpu__time_duration.sum --csv --print-units base \
      "$R" logits -m "$M" --device cuda --chunk "$c" --tokens "$tokens" --out "$W/rows-$c.f32" \
      > "$OUT/ncu-rows-$c.csv" 2> "$OUT/ncu-rows-$c.err" || tail -3 "$OUT/ncu-rows-$c.err"
    python3 "$ROOT/scripts/device/ncu_kernels.py" "$OUT/ncu-rows-$c.csv" embed_kernel \
      --by-grid --skip-batches "${ROWS_SKIP:-3}" > "$OUT/ncu-rows-by-grid-$c.txt" 2>&1
    head -40 "$OUT/ncu-rows-by-grid-$c.txt" | tee -a "$SUMMARY"
  done
fi
if stage replay && command -v ncu > /dev/null; then
  # The MTP rollback's own duration (deltanet_replay_kernel) in three-draft steps at 0.7.
  stamp "ncu: the replay kernel"
  timeout 200 ncu --clock-control none --cache-control none --graph-profiling node \
    --metrics gpu__time_duration.sum,dram__bytes.sum --csv --print-units base \
    --kernel-name regex:deltanet_replay --launch-skip 10 --launch-count 10 \
    "$R" bench -m "$M" --device cuda -p 0 -n 64 -r 1 --mtp --draft 3 --mtp-accept 0.7 \
    > "$OUT/ncu-replay.csv" 2> "$OUT/ncu-replay.err" || tail -3 "$OUT/ncu-replay.err"
  grep -E '^"' "$OUT/ncu-replay.csv" | grep -E 'gpu__time|dram__bytes' | awk -F'","' '{print $(NF-2), $NF}' \
    | tr -d '"' | head -20 | tee -a "$SUMMARY"
fi
if stage stalls && command -v ncu > /dev/null; then
  # STALL_CHUNK=4: the launches of 4-row batches (an MTP verification of three drafts) instead of
  # one-token steps; STALL_TOKENS tokens in all (default 8: 384 one-token gate/up launches; a
  # batch of 4 launches each kernel once a layer, so give 24 or more and skip fewer).
  tokens="$(python3 -c 'import sys; print(",".join(str((i * 7919 + 13) % 150000) for i in range(int(sys.argv[1]))))' "${STALL_TOKENS:-8}")"
  for entry in ${STALL_KERNELS:-matmul_q8_kernel moe_gate_up_q8_kernel moe_down_q8_preload_kernel deltanet_step_kernel}; do
    # An entry is a regex on the demangled name (template arguments included), optionally
    # @N: skip N launches of it (default 200; a kernel launched once a token needs fewer).
    k="${entry%@*}"; skip=200; [ "$entry" != "$k" ] && skip="${entry##*@}"
    n="$(echo "$k" | tr -c 'A-Za-z0-9_\n' '_')"  # a file name for the regex
    stamp "ncu sections, $k (after $skip launches)"
    # Skip the first token's launches (cold caches, the graph being recorded): the 200th
    # launch of the kernel is in a replayed decode step. Caches flushed before each pass:
    # a decode step's weights come from DRAM (1.5 GB a token through a 50 MB L2).
    # SourceCounters: warp stall samples per SASS instruction (the source page, as CSV).
    timeout 150 ncu --clock-control none --cache-control all --graph-profiling node \
      --kernel-name-base demangled --kernel-name "regex:$k" --launch-skip "$skip" \
      --import-source no \
      --launch-count 1 --section SpeedOfLight --section Occupancy --section LaunchStats \
      --section WarpStateStats --section MemoryWorkloadAnalysis --section SchedulerStats \
      --section SourceCounters --export "$W/ncu-$n" \
      "$R" logits -m "$M" --device cuda --chunk "${STALL_CHUNK:-1}" --tokens "$tokens" \
      > "$OUT/ncu-$n.txt" 2> "$OUT/ncu-$n.err" || tail -3 "$OUT/ncu-$n.err"
    ncu --import "$W/ncu-$n.ncu-rep" --print-details all > "$OUT/ncu-$n-details.txt" 2>&1
    ncu --import "$W/ncu-$n.ncu-rep" --page source --csv --print-source sass \
      > "$OUT/ncu-$n-sass.csv" 2> "$OUT/ncu-$n-sass.err" || tail -3 "$OUT/ncu-$n-sass.err"
    grep -E "Duration|Memory Throughput|DRAM Throughput|Achieved Occupancy|Registers Per|No Eligible|Stall|Warp Cycles Per Issued|Grid Size|Block Size" \
      "$OUT/ncu-$n-details.txt" | head -24 | tee -a "$SUMMARY"
  done
fi
stamp "done"
# A call brings back only a few files: everything but the summary goes back as one archive.
tar czf "$W/results.tgz" -C "$OUT" --exclude=summary.txt . && \
  find "$OUT" -mindepth 1 ! -name summary.txt -delete && mv "$W/results.tgz" "$OUT/"
