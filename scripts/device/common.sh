# Sourced by the device scripts (after setting SUMMARY and OUT): `note` prints a line and adds
# it to $SUMMARY, `stamp` the same with the seconds since the script began, `run_tests DIR
# NAME...` runs each carried test binary DIR/NAME one test at a time, its log into $OUT, and
# notes its result line and first failures.
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
