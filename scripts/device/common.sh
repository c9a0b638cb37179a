# Sourced by the device scripts (after setting ROOT): D (the carried files), W (the work
# folder), OUT (what comes back) and SUMMARY, unless the script set them, made and with the
# device's CUDA libraries on the loader path; `note` prints a line and adds it to $SUMMARY,
# `stamp` the same with the seconds since the script began, `run_tests DIR NAME...` runs each
# carried test binary DIR/NAME one test at a time, its log into $OUT, and notes its result line
# and first failures; `unpack XZ BIN` writes a carried build (prepare.sh's redlite.xz).
D="${D:-$ROOT/.cache/device}"; W="${W:-/tmp/rl}"; OUT="${OUT:-$W/results}"
SUMMARY="${SUMMARY:-$OUT/summary.txt}"
mkdir -p "$W" "$OUT" "$ROOT/target/release"
case ":${LD_LIBRARY_PATH:-}:" in
  *:/usr/local/cuda-13.0/targets/x86_64-linux/lib:*) ;;
  *) export LD_LIBRARY_PATH="/usr/local/cuda-13.0/targets/x86_64-linux/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ;;
esac
unpack() {
  python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
    "$1" "$2" && chmod +x "$2"
}
note() { echo "$*" | tee -a "$SUMMARY"; }
stamp() { note "[$SECONDS s] $*"; }
run_tests() {
  local dir="$1" t; shift
  for t in "$@"; do
    [ -x "$dir/$t" ] || { note "$t: not carried"; continue; }
    stamp "$t tests"
    "$dir/$t" --test-threads=1 > "$OUT/$t.log" 2>&1
    note "$t: $(grep -E '^test result' "$OUT/$t.log" | tail -1)"
    grep -E 'panicked|differ|FAILED' "$OUT/$t.log" | head -8 | tee -a "$SUMMARY"
  done
}
