#!/usr/bin/env bash
# Ingest benchmark: durable `sabi serve` (SQLite, every 200 fsynced) against the article's
# FastAPI + Redis peer, under the same signed-webhook load, in one run.
#
#   bench/ingest.sh            # defaults: 10 s closed loop, 20 s per open-loop rate
#   CLOSED_DURATION=8 OPEN_DURATION=10 REPEATS=3 bench/ingest.sh
#   STORE=postgres://root@127.0.0.1:5432/sabi_bench bench/ingest.sh   # Sabi on PostgreSQL
#
# Uses ../shared/bench (setup.sh installs wrk, the load generator and the peer's venv). Prints
# the peer's and Sabi's rows, their ratios, and writes everything under $BENCH_WORK/results.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
shared="${SABI_SHARED:-$here/../shared}/bench"
export BENCH_WORK="${BENCH_WORK:-/tmp/sabi-bench}"
bash "$shared/setup.sh" >/dev/null
cargo build --release --manifest-path "$here/Cargo.toml" >/dev/null
rm -rf "$BENCH_WORK/sabi-store"
store="${STORE:-sqlite://$BENCH_WORK/sabi-store/sabi.db}"
port="${PORT:-9080}"
export RATES="${RATES:-1000 2000 5000 10000}"
export SERVER_LABEL="${SERVER_LABEL:-sabi-${store%%:*}-durable}"
cd "$here"
exec bash "$shared/compare-ingest.sh" \
  "SABI_CONFIG=/dev/null SABI_LOG=warn SABI_LISTEN=127.0.0.1:\$BENCH_PORT SABI_WHATSAPP_APP_SECRET=\$BENCH_SECRET SABI_STORE=$store exec ./target/release/sabi serve" \
  "$port" bench-secret
