#!/usr/bin/env bash
# llama.cpp's llama-bench and `redlite bench` on the same file, same threads, alternating,
# then both figures and the ratio.
#
#   bash scripts/reference/setup.sh     # builds llama.cpp (CPU) from the pinned sdist, once
#   cargo build --release
#   bash scripts/bench/vs-llamacpp-cpu.sh FILE [THREADS] [ROUNDS]
#
# Env: PP (default 512), TG (default 128), REPS (llama-bench -r and redlite -r, default 3).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
FILE="${1:?usage: vs-llamacpp-cpu.sh FILE [THREADS] [ROUNDS]}"
THREADS="${2:-$(nproc)}"
ROUNDS="${3:-2}"
PP="${PP:-512}"; TG="${TG:-128}"; REPS="${REPS:-3}"
BENCH="${REF_DIR:-$ROOT/.cache/reference}/build/bin/llama-bench"
REDLITE="$ROOT/target/release/redlite"
OUT="${OUT:-$ROOT/.cache/bench}"
mkdir -p "$OUT"
[ -x "$BENCH" ] || { echo "no llama-bench: run scripts/reference/setup.sh" >&2; exit 1; }

for round in $(seq 1 "$ROUNDS"); do
  "$BENCH" -m "$FILE" -t "$THREADS" -p "$PP" -n "$TG" -r "$REPS" -o json > "$OUT/llamacpp-$round.json" 2> "$OUT/llamacpp-$round.log"
  "$REDLITE" --threads "$THREADS" bench -m "$FILE" -p "$PP" -n "$TG" -r "$REPS" --json > "$OUT/redlite-$round.json" 2> "$OUT/redlite-$round.log"
done

python3 - "$OUT" "$ROUNDS" "$PP" "$TG" "$THREADS" "$FILE" <<'PY'
import json, sys, statistics
out, rounds, pp, tg, threads, path = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6]
def llama(r):
    rows = json.load(open(f"{out}/llamacpp-{r}.json"))
    pick = lambda pred: next(x["avg_ts"] for x in rows if pred(x))
    return {"pp": pick(lambda x: x["n_prompt"] == pp and x["n_gen"] == 0), "tg": pick(lambda x: x["n_gen"] == tg and x["n_prompt"] == 0)}
def ours(r):
    rows = json.load(open(f"{out}/redlite-{r}.json"))["results"]
    return {"pp": next(x["avg_ts"] for x in rows if x["n_prompt"] == pp), "tg": next(x["avg_ts"] for x in rows if x["n_gen"] == tg)}
L = [llama(r) for r in range(1, rounds + 1)]
R = [ours(r) for r in range(1, rounds + 1)]
print(f"file {path}, {threads} threads, {rounds} alternating rounds")
print(f"| test | llama.cpp t/s | redlite t/s | ratio |")
print(f"|---|---|---|---|")
for key, name in (("pp", f"pp{pp}"), ("tg", f"tg{tg}")):
    l = statistics.mean(x[key] for x in L); o = statistics.mean(x[key] for x in R)
    print(f"| {name} | {l:.2f} | {o:.2f} | {o / l:.2f}x |")
PY
