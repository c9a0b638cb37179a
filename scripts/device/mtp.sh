#!/usr/bin/env bash
# On the GPU machine, one call: MTP speculative decoding (issue 9) checked and measured on the
# full synthetic file. In order:
#   1. the GPU tests: the DeltaNet kernels (the fused step over several rows equals one-row
#      launches), the MTP tests (every verification row the bits of a plain step), the
#      CUDA parity suite;
#   2. bits on the full file: `redlite logits` over 24 tokens fed one at a time (decode
#      graphs), three and four at a time (small-batch graphs) — the same bits — and, with
#      OLD=1, one at a time by the binary before this change (.cache/device/redlite-old.xz);
#   3. greedy text of 64 tokens with and without --mtp (--draft 1 and 3): the same text;
#   4. speed: `redlite bench -p 0 -n 128` with --mtp --draft 1, 2, 3 at forced acceptance
#      rates (each run times plain decoding first), the table last;
#   5. (stages small, ncu, serve; not by default) the wall time of batches of 1 to 4 tokens
#      (`bench -p 1,2,3,4`), and Nsight Compute's kernel durations for 16 tokens fed one and
#      four at a time (`redlite logits --chunk 1|4`: one-token and small-batch graphs); `redlite
#      serve` with 4 slots, 8 concurrent greedy streams against the same requests alone
#      (scripts/device/serve_smoke.py), plain and with --mtp.
# Carry .cache/device/redlite.xz and the test binaries deltanet, cuda_mtp, cuda_parity
# (scripts/device/prepare.sh), and redlite-old.xz for OLD=1.
#
#   bash scripts/device/mtp.sh
#
# Env: STAGES (tests bits text bench), RATES (0,0.5,0.7,0.9,1), DRAFTS (1 2 3), OUT.
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
D="$ROOT/.cache/device"; W=/tmp/rl; OUT="${OUT:-$W/results}"
mkdir -p "$W" "$OUT" "$ROOT/target/release"
STAGES=" ${STAGES:-tests bits text bench} "; stage() { [[ "$STAGES" == *" $1 "* ]]; }
RATES="${RATES:-0,0.5,0.7,0.9,1}"; DRAFTS="${DRAFTS:-1 2 3}"
R="$ROOT/target/release/redlite"; M="$W/full-IQ2_XXS-mtp.gguf"
SUMMARY="$OUT/summary.txt"
export LD_LIBRARY_PATH="/usr/local/cuda-13.0/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}"
# shellcheck source=scripts/device/common.sh
source "$ROOT/scripts/device/common.sh"
unxz_to() {
  python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
    "$1" "$2" && chmod +x "$2"
}
unxz_to "$D/redlite.xz" "$R"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$SUMMARY"
[ -f "$M" ] || "$R" synth "$M" --preset full --recipe IQ2_XXS --mtp 2>&1 | tail -1 | tee -a "$SUMMARY"

if stage tests; then
  for t in deltanet cuda_mtp cuda_parity; do
    [ -x "$D/$t" ] || { note "$t: not carried"; continue; }
    stamp "$t tests"
    "$D/$t" --test-threads=1 --nocapture > "$OUT/$t.log" 2>&1
    note "$t: $(grep -E '^test result' "$OUT/$t.log" | tail -1)"
    grep -E 'panicked|differs|FAILED' "$OUT/$t.log" | head -8 | tee -a "$SUMMARY"
  done
fi

if stage bits; then
  stamp "bits on the full file"
  tokens="$(python3 -c 'print(",".join(str((i * 7919 + 13) % 150000) for i in range(24)))')"
  logits() {  # binary chunk file
    "$1" logits -m "$M" --device cuda --chunk "$2" --tokens "$tokens" --out "$3" \
      > "$OUT/logits-$(basename "$3").log" 2>&1 || tail -3 "$OUT/logits-$(basename "$3").log"
  }
  logits "$R" 1 "$W/new-1.f32"; logits "$R" 3 "$W/new-3.f32"; logits "$R" 4 "$W/new-4.f32"
  same() { cmp -s "$1" "$2" && echo "same bits" || echo "DIFFERENT"; }
  note "full file, 24 tokens: chunk 3 vs chunk 1: $(same "$W/new-1.f32" "$W/new-3.f32"); chunk 4 vs 1: $(same "$W/new-1.f32" "$W/new-4.f32")"
  if [ "${OLD:-0}" = 1 ] && [ -f "$D/redlite-old.xz" ]; then
    unxz_to "$D/redlite-old.xz" "$W/redlite-old"
    logits "$W/redlite-old" 1 "$W/old-1.f32"
    note "full file, chunk 1: this build vs the one before: $(same "$W/old-1.f32" "$W/new-1.f32")"
    python3 - "$W/old-1.f32" "$W/new-1.f32" <<'PY' | tee -a "$SUMMARY"
import array, math, sys
a, b = (array.array("f", open(p, "rb").read()) for p in sys.argv[1:3])
if len(a) != len(b):
    print("  lengths differ"); sys.exit()
vocab = 151936
worst = max(math.sqrt(sum((x - y) ** 2 for x, y in zip(a[i:i + vocab], b[i:i + vocab])))
            / max(math.sqrt(sum(x * x for x in a[i:i + vocab])), 1e-30) for i in range(0, len(a), vocab))
am = sum(max(range(vocab), key=lambda j: a[i + j]) == max(range(vocab), key=lambda j: b[i + j])
         for i in range(0, len(a), vocab))
print(f"  worst rel L2 per position {worst:.3e}; argmax kept {am}/{len(a) // vocab}")
PY
  fi
fi

if stage text; then
  stamp "greedy text with and without MTP"
  gen() {  # name args...
    local name="$1"; shift
    "$R" generate -m "$M" --device cuda -p "The quick brown fox" -n 64 --temp 0 "$@" \
      > "$OUT/text-$name.txt" 2> "$OUT/text-$name.err"
  }
  gen plain; gen mtp1 --mtp; gen mtp3 --mtp --draft 3
  for v in mtp1 mtp3; do
    cmp -s "$OUT/text-plain.txt" "$OUT/text-$v.txt" && r="same text" || r="DIFFERENT text"
    note "greedy 64 tokens, $v vs plain: $r; $(grep -hE 'mtp:' "$OUT/text-$v.err" | tr '\n' ' ')"
  done
fi

if stage bench; then
  stamp "MTP bench (forced acceptance $RATES)"
  for k in $DRAFTS; do
    "$R" bench -m "$M" --device cuda -p 0 -n 128 -r 2 --mtp --draft "$k" --mtp-accept "$RATES" \
      > "$OUT/bench-draft$k.txt" 2>&1
    note "draft $k:"
    grep -E '^\| tg|verify' "$OUT/bench-draft$k.txt" | tr -s ' ' | tee -a "$SUMMARY"
  done
fi
if stage small; then
  stamp "batches of 1 to 4 tokens"
  for v in REDLITE_UNUSED=0 REDLITE_SMALL_BATCH_MATVEC=0; do
    env "$v" "$R" bench -m "$M" --device cuda -p 1,2,3,4 -n 0 -r 20 > "$OUT/small-$v.txt" 2>&1
    note "$v: $(grep -E '^\| pp' "$OUT/small-$v.txt" | tr -s ' ' | tr '\n' ' ')"
  done
fi

if stage ncu && command -v ncu > /dev/null; then
  tokens="$(python3 -c 'print(",".join(str((i * 7919 + 13) % 150000) for i in range(16)))')"
  for chunk in 1 4; do
    stamp "ncu, 16 tokens $chunk at a time"
    timeout 240 ncu --clock-control none --cache-control none --graph-profiling node \
      --metrics gpu__time_duration.sum --csv --print-units base \
      "$R" logits -m "$M" --device cuda --chunk "$chunk" --tokens "$tokens" \
      > "$OUT/ncu-chunk$chunk.csv" 2> "$OUT/ncu-chunk$chunk.err"
    python3 "$ROOT/scripts/device/ncu_kernels.py" "$OUT/ncu-chunk$chunk.csv" embed_kernel \
      > "$OUT/ncu-chunk$chunk.txt" 2>&1
    head -30 "$OUT/ncu-chunk$chunk.txt" | tee -a "$SUMMARY"
  done
fi
if stage serve; then
  for flags in "" "--mtp"; do
    name="serve${flags:+-mtp}"
    stamp "$name"
    "$R" serve -m "$M" --device cuda --slots 4 --snapshots 0 --ctx 2048 --port 18080 $flags \
      > "$OUT/$name.log" 2>&1 &
    pid=$!
    for _ in $(seq 240); do curl -sf http://127.0.0.1:18080/health > /dev/null && break; sleep 1; done
    timeout 150 python3 "$ROOT/scripts/device/serve_smoke.py" http://127.0.0.1:18080 8 32 \
      > "$OUT/$name.txt" 2>&1
    kill -INT "$pid"; wait "$pid"
    note "$name: $(grep -E 'equal to the request alone' "$OUT/$name.txt")"
    grep -iE 'error|mtp' "$OUT/$name.txt" | head -3 | tee -a "$SUMMARY"
  done
fi
stamp "done"
