#!/usr/bin/env bash
# What one durable webhook costs `sabi serve` on SQLite: CPU microseconds (user and system) and
# bytes handed to write/pwrite, per message stored, over a closed loop of signed webhooks (wrk,
# 64 connections, the bench's distinct ~1 KB bodies). The server runs on CPU 1, the load on
# CPU 0; CPU time and bytes are read from /proc before and after, messages counted in the inbox.
# Several builds are measured alternately, ROUNDS times, so that their figures share the hour.
#
#   bench/cost.sh target/release/sabi                       # this build, 2 rounds
#   ROUNDS=3 bench/cost.sh /tmp/sabi-before target/release/sabi
#   DURATION=10 bench/cost.sh ...                           # seconds of load per run (10)
#
# A build may be a wrapper script that sets SABI_* variables and execs the binary (the PID read
# is the server's as long as the wrapper execs). Needs ../shared/bench (setup.sh: wrk).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
shared="${SABI_SHARED:-$here/../shared}/bench"
export BENCH_WORK="${BENCH_WORK:-/tmp/sabi-bench}"
bash "$shared/setup.sh" >/dev/null
[ $# -ge 1 ] || { echo "usage: bench/cost.sh SABI_BIN [SABI_BIN...]" >&2; exit 2; }
port="${PORT:-9181}"
work="$BENCH_WORK/cost"
url="http://127.0.0.1:$port/webhook/whatsapp"

count() { python3 -c "import sqlite3,sys; print(sqlite3.connect(sys.argv[1]).execute('SELECT count(*) FROM inbox').fetchone()[0])" "$1"; }
cpu() { awk '{print $14 + $15, $14, $15}' "/proc/$1/stat"; }
wchar() { awk '/^wchar/{print $2}' "/proc/$1/io"; }

measure() {  # measure BIN LABEL
  local dir="$work/$2" pid
  rm -rf "$dir"; mkdir -p "$dir"
  python3 "$shared/gen_requests.py" --mode webhook --secret bench-secret --count 300000 \
    --out "$dir/requests.txt" --run-id "$2-$RANDOM" >/dev/null 2>&1
  SABI_CONFIG=/dev/null SABI_LOG=warn SABI_LISTEN="127.0.0.1:$port" \
    SABI_WHATSAPP_APP_SECRET=bench-secret SABI_MARKER_SECRET=cost-bench-marker-secret \
    SABI_STORE="sqlite://$dir/sabi.db" taskset -c 1 "$1" serve >"$dir/server.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$port/healthz" >/dev/null && break; sleep 0.1; done
  REQ_FILE="$dir/requests.txt" taskset -c 0 wrk -t1 -c16 -d2s -s "$shared/wrk_replay.lua" "$url" >/dev/null 2>&1
  sleep 1
  local n0 c0 w0 n1 c1 w1
  n0=$(count "$dir/sabi.db"); read -r c0 u0 s0 < <(cpu "$pid"); w0=$(wchar "$pid")
  REQ_FILE="$dir/requests.txt" taskset -c 0 wrk -t1 -c64 -d"${DURATION:-10}s" \
    -s "$shared/wrk_replay.lua" "$url" >/dev/null 2>&1
  sleep 2
  n1=$(count "$dir/sabi.db"); read -r c1 u1 s1 < <(cpu "$pid"); w1=$(wchar "$pid")
  kill "$pid"; wait "$pid" 2>/dev/null || true
  local tick; tick=$(getconf CLK_TCK)
  python3 - "$2" "$((n1 - n0))" "$((c1 - c0))" "$((u1 - u0))" "$((s1 - s0))" "$((w1 - w0))" "$tick" <<'PY'
import sys
label, n, ticks, user, system, written, hz = sys.argv[1], *map(int, sys.argv[2:])
us = lambda t: t * 1e6 / hz / max(n, 1)
print(f"{label:<24}{n:>10}{us(ticks):>10.1f}{us(user):>8.1f}{us(system):>8.1f}{written / max(n, 1):>12.0f}")
PY
}

printf '%-24s%10s%10s%8s%8s%12s\n' build messages "µs/msg" user system "bytes/msg"
for round in $(seq 1 "${ROUNDS:-2}"); do
  i=0
  for bin in "$@"; do
    i=$((i + 1))
    measure "$bin" "$i-$(basename "$bin")-$round"
  done
done
