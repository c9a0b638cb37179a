#!/usr/bin/env bash
# On the GPU machine, one short call: this build (.cache/device/redlite.xz) against an earlier
# one (.cache/device/redlite-base.xz) on the full RECIPE+MTP file (IQ2_XXS unless set), the
# cheapest order for a change meant to keep the bits: the logits of 24 tokens fed one and four
# at a time (`cmp`; also of BASE_LONG tokens one at a time when set), tg128 at depths 0 and 4096
# alternating (ROUNDS, f16 KV), MTP at acceptance MTP_ACCEPT (0.7; a comma list such as 0.7,1
# runs each) with each of MTP_DRAFTS drafts (1; a space: none), with SMALL=1 batches of 1 to 4
# tokens (two alternating rounds), then the GPU tests of TESTS. Carry both builds and the test binaries named in TESTS
# (scripts/device/prepare.sh; copy the earlier redlite.xz to redlite-base.xz before building).
# BASE_ENV (VAR=value, several joined by +): the base is this build run under those settings
# (a compile option's A/B, e.g. REDLITE_Q8_DECODE_ONCE=0) and redlite-base.xz is not needed.
#
#   TESTS="cuda_parity cuda_expert_cache" [RECIPE=IQ1_M] bash scripts/device/vs_base.sh
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# shellcheck source=scripts/device/common.sh
source "$ROOT/scripts/device/common.sh"
R="$ROOT/target/release/redlite"; B="$W/redlite-base"; RECIPE="${RECIPE:-IQ2_XXS}"
M="$W/full-$RECIPE-mtp.gguf"
unpack "$D/redlite.xz" "$R"
if [ -n "${BASE_ENV:-}" ]; then
  printf '#!/bin/sh\nexec env %s %s "$@"\n' "${BASE_ENV//+/ }" "$R" > "$B" && chmod +x "$B"
  note "base: this build under $BASE_ENV"
else
  unpack "$D/redlite-base.xz" "$B"
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$SUMMARY"
[ -f "$M" ] || "$R" synth "$M" --preset full --recipe "$RECIPE" --mtp 2>&1 | tail -1 | tee -a "$SUMMARY"

stamp "logits"
tokens="$(python3 -c 'print(",".join(str((i * 7919 + 13) % 150000) for i in range(24)))')"
for chunk in 1 4; do
  for bin in "$R" "$B"; do
    "$bin" logits -m "$M" --device cuda --chunk "$chunk" --tokens "$tokens" \
      --out "$W/$(basename "$bin")-$chunk.f32" > /dev/null 2>&1
  done
  cmp -s "$W/redlite-$chunk.f32" "$W/redlite-base-$chunk.f32" && r="same bits" || r=DIFFERENT
  note "logits, this build vs base, chunk $chunk: $r"
done
if [ -n "${BASE_LONG:-}" ]; then
  # BASE_LONG tokens fed one at a time (decode graphs at every depth up to it: at 2,048 and
  # more every attention split of the graph is live), every position's logits compared.
  long="$(python3 -c 'import sys; print(",".join(str((i * 7919 + 13) % 150000) for i in range(int(sys.argv[1]))))' "$BASE_LONG")"
  for bin in "$R" "$B"; do
    "$bin" logits -m "$M" --device cuda --chunk 1 --tokens "$long" \
      --out "$W/$(basename "$bin")-long.f32" > /dev/null 2>&1
  done
  cmp -s "$W/redlite-long.f32" "$W/redlite-base-long.f32" && r="same bits" || r=DIFFERENT
  note "logits of $BASE_LONG tokens one at a time, this build vs base: $r"
  rm -f "$W/redlite-long.f32" "$W/redlite-base-long.f32"
fi

stamp "tg128, alternating"
for round in $(seq 1 "${ROUNDS:-2}"); do
  for bin in "$R" "$B"; do
    note "round $round, $(basename "$bin"): $("$bin" bench -m "$M" --device cuda --kv f16 -p 0 -n 128 \
      -d 0,4096 -r 3 2>&1 | grep -E '^\| tg' | tr -s ' ' | tr '\n' ' ')"
  done
done
stamp "MTP at ${MTP_ACCEPT:-0.7}"
for k in ${MTP_DRAFTS:-1}; do
  for bin in "$R" "$B"; do
    note "$(basename "$bin"), $k draft(s): $("$bin" bench -m "$M" --device cuda --kv f16 -p 0 -n 128 \
      -r 2 --mtp --draft "$k" --mtp-accept "${MTP_ACCEPT:-0.7}" 2>&1 | grep -E '^\| tg' | cut -c1-120 \
      | tr -s ' ' | tr '\n' ' ')"
  done
done
if [ "${SMALL:-0}" = 1 ]; then
  stamp "batches of 1 to 4 tokens, alternating"
  for bin in "$R" "$B" "$R" "$B"; do
    note "$(basename "$bin"): $("$bin" bench -m "$M" --device cuda -p 1,2,3,4 -n 0 -r 20 2>&1 \
      | grep -E '^\| pp' | tr -s ' ' | tr '\n' ' ')"
  done
fi
# shellcheck disable=SC2086
run_tests "$D" ${TESTS:-}
stamp "done"
