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
#   bash scripts/bench/vs-llamacpp-cuda.sh mtp       # issue 9: llama.cpp's draft-mtp and redlite's --mtp
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
    # llama-speculative-simple too where the sources have it (llama.cpp's `draft-mtp`; the `mtp` stage).
    examples=OFF; targets=llama-bench
    if [ -d "$WORK/llama/examples/speculative-simple" ]; then
      printf 'find_package(Threads REQUIRED)\nllama_add_compile_flags()\nadd_subdirectory(speculative-simple)\n' \
        > "$WORK/llama/examples/CMakeLists.txt"
      examples=ON; targets="llama-bench llama-speculative-simple"
    fi
    (cd "$WORK/llama" && EXAMPLES="$examples" TARGETS="$targets" setsid nohup bash -c 'cmake -B build -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=$EXAMPLES -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
      -DLLAMA_CURL=OFF -DCMAKE_BUILD_TYPE=Release > build.log 2>&1 && cmake --build build -j 14 --target $TARGETS >> build.log 2>&1; echo done > build.done' \
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
mtp)
  # Issue 9's peer: llama.cpp's `draft-mtp` (llama-speculative-simple, greedy, every draft kept
  # whatever its probability) against redlite's --mtp on the same file with its MTP block, at
  # the file's own acceptance (random weights: almost none) and redlite's forced acceptance 1;
  # plain decoding of both first. DRAFTS (1 3). llama-speculative-simple restores a checkpoint
  # after a partial acceptance and runs the trunk's own tokens again as the next "draft", which
  # it then counts as accepted: its accept line is not the MTP block's acceptance.
  ensure_redlite
  M="$WORK/full-$RECIPE-mtp.gguf"
  [ -f "$M" ] || "$ROOT/target/release/redlite" synth "$M" --preset full --recipe "$RECIPE" --mtp 2>&1 | tail -1
  while [ ! -f "$WORK/llama/build.done" ]; do sleep 5; done
  spec="$WORK/llama/build/bin/llama-speculative-simple"
  [ -x "$spec" ] || { tail -20 "$WORK/llama/build.log"; exit 1; }
  prompt="Here is a quick sort implementation in C++. Just code, no comments:"
  "$WORK/llama/build/bin/llama-bench" -m "$M" -ngl 99 -fa 1 -p 0 -n "$TG" -r 3 -o json \
    > "$LOGS/mtp-llamacpp-plain.json" 2> "$LOGS/mtp-llamacpp-plain.log" || tail -5 "$LOGS/mtp-llamacpp-plain.log"
  for n in ${DRAFTS:-1 3}; do
    "$spec" -m "$M" -p "$prompt" --spec-type draft-mtp --spec-draft-n-max "$n" --spec-draft-p-min 0 \
      -n "$TG" -ngl 99 -ngld 99 -fa on --temp 0 --top-k 1 --seed 1 > "$LOGS/mtp-llamacpp-$n.log" 2>&1 \
      || tail -5 "$LOGS/mtp-llamacpp-$n.log"
    "$ROOT/target/release/redlite" bench -m "$M" --device cuda --kv f16 -p 0 -n "$TG" -r 3 --mtp --draft "$n" \
      > "$LOGS/mtp-redlite-$n.txt" 2>&1 || tail -5 "$LOGS/mtp-redlite-$n.txt"
    "$ROOT/target/release/redlite" bench -m "$M" --device cuda --kv f16 -p 0 -n "$TG" -r 3 --mtp --draft "$n" \
      --mtp-accept 1 > "$LOGS/mtp-redlite-$n-a1.txt" 2>&1 || tail -5 "$LOGS/mtp-redlite-$n-a1.txt"
  done
  python3 - "$LOGS" "${DRAFTS:-1 3}" <<'PY'
import json, re, sys
logs, drafts = sys.argv[1], sys.argv[2].split()
def read(path):
    try:
        return open(path, errors="replace").read()
    except OSError:
        return ""
try:
    plain = json.load(open(f"{logs}/mtp-llamacpp-plain.json"))[0]["avg_ts"]
except Exception:
    plain = float("nan")
print(f"llama.cpp plain tg: {plain:.1f} t/s (llama-bench)")
print("| drafts | llama.cpp draft-mtp t/s | its accept line | redlite plain | redlite --mtp | redlite --mtp, acceptance 1 |")
print("|---|---|---|---|---|---|")
for n in drafts:
    text = read(f"{logs}/mtp-llamacpp-{n}.log")
    speed = re.search(r"decoded\s+\d+ tokens in\s+[\d.]+ seconds, speed:\s+([\d.]+) t/s", text)
    accept = re.search(r"accept\s+=\s+([\d.]+)%", text)
    ours = read(f"{logs}/mtp-redlite-{n}.txt")
    rows = re.findall(r"^\|\s*(tg[^|]*?)\s*\|\s*([\d.]+)", ours, re.M)
    forced = re.findall(r"^\|\s*(tg[^|]*?)\s*\|\s*([\d.]+)", read(f"{logs}/mtp-redlite-{n}-a1.txt"), re.M)
    cell = lambda rows, i: rows[i][1] if len(rows) > i else "-"
    print(f"| {n} | {speed.group(1) if speed else '-'} | {accept.group(1) + ' %' if accept else '-'} | "
          f"{cell(rows, 0)} | {cell(rows, 1)} | {cell(forced, 1)} |")
PY
  ;;
all)
  # Every recipe of RECIPES (default RECIPE) in one call: the files are written while llama.cpp
  # builds, then each recipe's benches, its logs under $LOGS/RECIPE; with MTP=1 then the `mtp`
  # stage on the first recipe (its file with the MTP block written there), logs under $LOGS/mtp.
  recipes="${RECIPES:-$RECIPE}"
  "$0" build
  for r in ${recipes//,/ }; do RECIPE="$r" "$0" synth; done
  for r in ${recipes//,/ }; do RECIPE="$r" OUT="$LOGS/$r" "$0" bench; done
  if [ "${MTP:-0}" = 1 ]; then
    mkdir -p "$LOGS/mtp"
    RECIPE="${recipes%%,*}" OUT="$LOGS/mtp" "$0" mtp
  fi
  ;;
esac
