#!/usr/bin/env bash
# On the GPU machine: decode settings measured in interleaved rounds (one process each, every
# setting once a round, ROUNDS rounds), tg128 at DEPTHS with f16 KV on the full synthetic
# IQ2_XXS+MTP file, then each setting's mean beside the defaults'. decode_ab.sh runs each
# setting once; process-to-process spread (about 1 %) needs rounds for effects of that size.
# Carry .cache/device/redlite.xz (scripts/device/prepare.sh).
#
#   AB="REDLITE_GRAPH_EARLY_LAUNCH=0 REDLITE_ATTN_SPLIT_WARPS=8" bash scripts/device/ab_rounds.sh
#
# Env: AB (settings, each VAR=value or several joined by +), ROUNDS (3), DEPTHS (0,4096),
# KV (the cache type, f16 unless set), BENCH_EXTRA (more bench arguments: with `--mtp --draft N
# --mtp-accept R` each run's table has the plain and the MTP row), TAG (names this comparison's
# files, so several can share OUT), M (the file; written with its MTP block if absent), OUT.
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# shellcheck source=scripts/device/common.sh
source "$ROOT/scripts/device/common.sh"
R="$ROOT/target/release/redlite"; M="${M:-$W/full-IQ2_XXS-mtp.gguf}"
unpack "$D/redlite.xz" "$R"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$SUMMARY"
[ -f "$M" ] || "$R" synth "$M" --preset full --recipe IQ2_XXS --mtp 2>&1 | tail -1 | tee -a "$SUMMARY"
settings=(REDLITE_UNUSED=0 ${AB:-})
for round in $(seq 1 "${ROUNDS:-3}"); do
  stamp "round $round"
  for v in "${settings[@]}"; do
    # shellcheck disable=SC2086
    env ${v//+/ } "$R" bench -m "$M" --device cuda -p 0 -n 128 -d "${DEPTHS:-0,4096}" -r 3 \
      --kv "${KV:-f16}" ${BENCH_EXTRA:-} > "$OUT/ab${TAG:-}-${v//[=+]/_}-$round.txt" 2>&1
    note "$v: $(grep -E '^\| tg' "$OUT/ab${TAG:-}-${v//[=+]/_}-$round.txt" | cut -c1-60 | tr -s ' ' | tr '\n' ' ')"
  done
done
python3 - "$OUT" "${TAG:-}" "${settings[@]}" <<'PY' | tee -a "$SUMMARY"
import glob, re, statistics, sys
out, tag, settings = sys.argv[1], sys.argv[2], sys.argv[3:]
def means(v):
    rows = {}
    for path in sorted(glob.glob(f"{out}/ab{tag}-{re.sub('[=+]', '_', v)}-*.txt")):
        # Test names as bench prints them: "tg128", "tg128 @ d4096", "tg128 mtp1 a0.7".
        for test, tps in re.findall(r"^\|\s*(tg[^|]*?)\s*\|\s*([\d.]+)", open(path).read(), re.M):
            rows.setdefault(test, []).append(float(tps))
    return {t: statistics.mean(x) for t, x in rows.items()}
base = means(settings[0])
print("| setting | " + " | ".join(base) + " |")
for v in settings:
    m = means(v)
    cells = [f"{m[t]:.2f} ({100 * (m[t] / base[t] - 1):+.1f} %)" if t in m else "-" for t in base]
    print(f"| {v} | " + " | ".join(cells) + " |")
PY
