#!/usr/bin/env bash
# Web-chat benchmark: POST /chat intake on Sabi (durable SQLite, an API node) against the
# article's RQ design (FastAPI + RQ on a non-durable Redis), neither running a worker, same load.
#
#   bench/chat.sh                                  # defaults: 10 s closed loop, 20 s per rate
#   CLOSED_DURATION=8 OPEN_DURATION=10 RATES="500 1000 2000" bench/chat.sh
#
# Uses ../shared/bench (setup.sh, ingest-bench.sh in MODE=chat, lib.sh). Sabi is pinned like
# compare-ingest.sh pins a server (all CPUs but the load generator's); the peer runs 2 uvicorn
# workers unpinned, its best configuration. Results and the table go under $BENCH_WORK/results.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
shared="${SABI_SHARED:-$here/../shared}/bench"
export BENCH_WORK="${BENCH_WORK:-/tmp/sabi-bench}"
export REPEATS="${REPEATS:-1}" LOADGEN_CPU="${LOADGEN_CPU-0}" MODE=chat
RATES=(${RATES:-500 1000 2000 5000})
bash "$shared/setup.sh" >/dev/null
cargo build --release --manifest-path "$here/Cargo.toml" >/dev/null
STAMP=$(date +%Y%m%d-%H%M%S)
RUN_DIR="$BENCH_WORK/run/chat-$STAMP-$$"
BENCH_DIR="$shared"
source "$shared/lib.sh"
RES="$RESULTS_DIR/chat-$STAMP"
mkdir -p "$RES"
SERVER_CPUS=${SERVER_CPUS-$(default_server_cpus)}
REDIS_PORT=$(free_port 16391)
PEER_PORT=$(free_port 18002 "$REDIS_PORT")
SABI_PORT=$(free_port 19080 "$REDIS_PORT" "$PEER_PORT")
trap 'stop_bg sabi; stop_bg peer; stop_bg redis' EXIT

bench() {  # bench LABEL URL
  OUT="$RES/$1" LABEL="$1" bash "$shared/ingest-bench.sh" "$2" unused "${RATES[@]}" | tee "$RES/$1.txt"
}

# poll LABEL URL : GET one job's status, closed loop (wrk, 64 connections, 10 s): throughput
# and latency percentiles (service time under load; wrk's closed loop under-reports queueing).
poll() {
  local out="$RES/$1-get.txt"
  ${LOADGEN_CPU:+taskset -c "$LOADGEN_CPU"} wrk -t1 -c64 -d"${GET_DURATION:-10}"s --latency "$2" > "$out"
  printf '%-22s GET %s: %s req/s, p50 %s, p99 %s\n' "$1" "$2" \
    "$(awk '/Requests\/sec/ {print $2}' "$out")" \
    "$(awk '$1 == "50%" {print $2}' "$out")" "$(awk '$1 == "99%" {print $2}' "$out")" | tee -a "$RES/get.txt"
}

echo "== peer: RQ chat submit, 2 uvicorn workers, non-durable Redis" >&2
start_redis redis "$REDIS_PORT" "" mem
start_p2 peer "$PEER_PORT" "$REDIS_PORT" 2 ""
BETWEEN_RUNS="redis-cli -p $REDIS_PORT flushall" bench peer-rq-2w "http://127.0.0.1:$PEER_PORT/chat"
curl -s -o /dev/null -H 'content-type: application/json' -d '{"session_id":"bench","message_id":"m1","text":"hello"}' \
  "http://127.0.0.1:$PEER_PORT/chat"
poll peer-rq-2w "http://127.0.0.1:$PEER_PORT/chat/m1?session_id=bench"
stop_bg peer; stop_bg redis

echo "== sabi: durable SQLite, CPUs ${SERVER_CPUS:-all}" >&2
store="$BENCH_WORK/sabi-chat-store"
rm -rf "$store"; mkdir -p "$store"
# The load never waits for answers: let the queue grow instead of refusing (the default limit
# is 1,000 waiting questions), so that the figure is the intake's.
printf '[webchat]\nmax_queue = 100000000\nper_session_per_minute = 1000\n' > "$store/sabi.toml"
start_bg sabi "$SERVER_CPUS" env SABI_CONFIG="$store/sabi.toml" SABI_LOG=warn \
  SABI_LISTEN="127.0.0.1:$SABI_PORT" SABI_STORE="sqlite://$store/sabi.db" "$here/target/release/sabi" serve --role api
wait_http "http://127.0.0.1:$SABI_PORT/healthz" 30
bench sabi-sqlite-durable "http://127.0.0.1:$SABI_PORT/chat"
job=$(curl -s -H 'content-type: application/json' -d '{"session_id":"bench-0123456789abcdef01234","message_id":"m1","question":"hello"}' \
  "http://127.0.0.1:$SABI_PORT/chat" | python3 -c 'import json, sys; print(json.load(sys.stdin)["job_id"])')
poll sabi-sqlite-durable "http://127.0.0.1:$SABI_PORT/chat/$job?session_id=bench-0123456789abcdef01234"
stop_bg sabi

python3 "$shared/compare_table.py" "$RES/peer-rq-2w" "$RES/sabi-sqlite-durable" "${RATES[@]}" | tee "$RES/compare.txt"
cat "$RES/get.txt"
