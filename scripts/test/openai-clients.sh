#!/usr/bin/env bash
# `redlite serve` driven by real clients: the official `openai` Python package (pinned, with
# the httpx2 HTTP client it brings, in a venv under .cache/test-venv, reused when present; the
# scripts use httpx2 directly where the SDK gets in the way) runs the checks of openai_clients.py
# against one server, then load_test.py runs 32 concurrent streaming clients against a second
# server whose queue is shorter than the crowd, so both waiting and 503 + Retry-After happen.
# The default model is used (no -m: the binary writes a tiny random-weight model with the real
# Qwen vocabulary to its cache, REDLITE_CACHE or ~/.cache/redlite, on first use). Runs on a
# 2-core machine without a GPU in a few minutes; exits non-zero on any failure.
#
#   bash scripts/test/openai-clients.sh [REDLITE_BIN]
#
# Env: LOAD_CLIENTS (32), LOAD_REQUESTS (3 per client), LOAD_QUEUE (8: the load server's
# --queue), LOAD_TIME_LIMIT (240 s for the concurrent phase), LOAD_ARGS (more load_test.py
# flags, e.g. --conversations), LOGS (where the server logs go, default .cache/test-logs).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
HERE="$ROOT/scripts/test"
OPENAI_VERSION=3.57.0
VENV="$ROOT/.cache/test-venv"
LOGS="${LOGS:-$ROOT/.cache/test-logs}"
API_KEY=test-key
SERVE_ARGS=(--slots 4 --ctx 2048 --api-key "$API_KEY")
mkdir -p "$LOGS"

if [ $# -ge 1 ]; then
  REDLITE="$1"
else
  REDLITE="$ROOT/target/release/redlite"
  [ -x "$REDLITE" ] || (cd "$ROOT" && cargo build --release)
fi
[ -x "$REDLITE" ] || { echo "no redlite binary at $REDLITE" >&2; exit 1; }

PY="$VENV/bin/python"
if ! "$PY" -c "import openai, sys; sys.exit(openai.__version__ != '$OPENAI_VERSION')" 2>/dev/null; then
  echo "== venv: openai==$OPENAI_VERSION into $VENV"
  [ -x "$PY" ] || python3 -m venv "$VENV"
  "$PY" -m pip install -q "openai==$OPENAI_VERSION"
fi

SERVER_PID=""
stop_server() {
  if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
    # Ctrl-C is the server's graceful shutdown; a server still up after 10 s is killed.
    kill -INT "$SERVER_PID" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$SERVER_PID" 2>/dev/null; then
      echo "redlite serve (pid $SERVER_PID) still running 10 s after SIGINT: killed" >&2
      kill -9 "$SERVER_PID" 2>/dev/null || true
    fi
    wait "$SERVER_PID" 2>/dev/null || true
  fi
  SERVER_PID=""
}
trap stop_server EXIT
trap 'exit 130' INT TERM

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# start_server NAME EXTRA_ARGS...: sets PORT and SERVER_PID once GET /health answers 200.
start_server() {
  local name="$1"; shift
  local log="$LOGS/$name.log"
  PORT="$(free_port)"
  "$REDLITE" serve --host 127.0.0.1 --port "$PORT" "${SERVE_ARGS[@]}" "$@" > "$log" 2>&1 &
  SERVER_PID=$!
  # The first start writes the default model (a few seconds); a cold CI machine gets 180 s.
  for _ in $(seq 1800); do
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then
      echo "redlite serve exited before answering /health; its log:" >&2
      tail -n 40 "$log" >&2
      SERVER_PID=""
      return 1
    fi
    if [ "$(python3 -c "
import urllib.request, sys
try:
    print(urllib.request.urlopen('http://127.0.0.1:$PORT/health', timeout=2).status)
except Exception:
    print(0)")" = "200" ]; then
      echo "== $name server: http://127.0.0.1:$PORT (pid $SERVER_PID, log $log): $(grep -m1 'listening on' "$log" || echo 'no listening line')"
      return 0
    fi
    sleep 0.1
  done
  echo "redlite serve did not answer /health within 180 s; its log:" >&2
  tail -n 40 "$log" >&2
  return 1
}

failed=()
deaths=0

# server_alive NAME: the server must have survived what was just sent to it.
server_alive() {
  if ! kill -0 "$SERVER_PID" 2>/dev/null; then
    echo "redlite serve died during $1; the end of its log:" >&2
    tail -n 40 "$LOGS/$1.log" >&2
    failed+=("the $1 server died")
    deaths=$((deaths + 1))
    SERVER_PID=""
  fi
}

echo "== API checks (openai $OPENAI_VERSION)"
start_server api
if ! "$PY" "$HERE/openai_clients.py" --base-url "http://127.0.0.1:$PORT" --api-key "$API_KEY" \
    | tee "$LOGS/api-transcript.txt"; then
  failed+=("openai_clients.py")
fi
server_alive api
stop_server

echo
echo "== load test"
start_server load --queue "${LOAD_QUEUE:-8}"
if ! "$PY" "$HERE/load_test.py" --base-url "http://127.0.0.1:$PORT" --api-key "$API_KEY" \
    --clients "${LOAD_CLIENTS:-32}" --requests "${LOAD_REQUESTS:-3}" \
    --time-limit "${LOAD_TIME_LIMIT:-240}" --slots 4 --queue "${LOAD_QUEUE:-8}" ${LOAD_ARGS:-} \
    | tee "$LOGS/load-transcript.txt"; then
  failed+=("load_test.py")
fi
server_alive load
stop_server

# One closing line over both programs (their own last lines are "N passed, N failed").
passed=0; failures=$deaths
for t in api load; do
  line="$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$LOGS/$t-transcript.txt" 2>/dev/null | tail -n 1 || true)"
  if [ -n "$line" ]; then
    passed=$((passed + $(echo "$line" | cut -d' ' -f1)))
    failures=$((failures + $(echo "$line" | cut -d' ' -f3)))
  fi
done
echo
if [ ${#failed[@]} -gt 0 ]; then
  echo "FAILED: ${failed[*]} (server logs and transcripts in $LOGS)"
  [ "$failures" -gt 0 ] || failures=${#failed[@]}
  echo "clients: $passed passed, $failures failed"
  exit 1
fi
echo "clients: $passed passed, 0 failed"
