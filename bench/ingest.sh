#!/usr/bin/env bash
# Ingest benchmark: durable `sabi serve` (SQLite, every 200 fsynced) against the article's
# FastAPI + Redis peer, under the same signed-webhook load, in one run.
#
#   bench/ingest.sh            # defaults: 10 s closed loop, 20 s per open-loop rate
#   CLOSED_DURATION=8 OPEN_DURATION=10 REPEATS=3 bench/ingest.sh
#   STORE=postgres://root@127.0.0.1:5432/sabi_bench bench/ingest.sh   # Sabi on PostgreSQL
#   STORE=redis bench/ingest.sh      # Sabi on a redis-server of its own, appendfsync always
#   STORE=redis://host:6379 bench/ingest.sh                            # Sabi on that Redis
#   SABI_BIN=/path/to/sabi bench/ingest.sh   # another build (an older commit, to compare with)
#
# Uses ../shared/bench (setup.sh installs wrk, the load generator and the peer's venv). Prints
# the peer's and Sabi's rows, their ratios, and writes everything under $BENCH_WORK/results.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
shared="${SABI_SHARED:-$here/../shared}/bench"
export BENCH_WORK="${BENCH_WORK:-/tmp/sabi-bench}"
bash "$shared/setup.sh" >/dev/null
if [ -z "${SABI_BIN:-}" ]; then
  cargo build --release --manifest-path "$here/Cargo.toml" >/dev/null
  SABI_BIN=./target/release/sabi
fi
rm -rf "$BENCH_WORK/sabi-store"
store="${STORE:-sqlite://$BENCH_WORK/sabi-store/sabi.db}"
if [ "$store" = redis ]; then
  # As durable as the other stores: the append-only file flushed before each answer.
  redis_port="${REDIS_PORT:-6391}"
  mkdir -p "$BENCH_WORK/sabi-store"
  redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly yes \
    --appendfsync always --dir "$BENCH_WORK/sabi-store" --daemonize yes \
    --pidfile "$BENCH_WORK/sabi-store/redis.pid" --logfile "$BENCH_WORK/sabi-store/redis.log"
  trap 'kill "$(cat "$BENCH_WORK/sabi-store/redis.pid")" 2>/dev/null || true' EXIT
  until redis-cli -p "$redis_port" ping >/dev/null 2>&1; do sleep 0.1; done
  store="redis://127.0.0.1:$redis_port?durability=require"
fi
port="${PORT:-9080}"
export RATES="${RATES:-1000 2000 5000 10000}"
export SERVER_LABEL="${SERVER_LABEL:-sabi-${store%%:*}-durable}"
cd "$here"
bash "$shared/compare-ingest.sh" \
  "SABI_CONFIG=/dev/null SABI_LOG=warn SABI_LISTEN=127.0.0.1:\$BENCH_PORT SABI_WHATSAPP_APP_SECRET=\$BENCH_SECRET SABI_MARKER_SECRET=ingest-bench-marker-secret SABI_STORE='$store' exec $SABI_BIN serve" \
  "$port" bench-secret
