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
#   SABI_BIN_BEFORE=/path/to/old/sabi ROUNDS=5 bench/ingest.sh
#       # no peer: the previous build and this one alternately, ROUNDS pairs (default 3, the
#       # first of each pair alternating), each on a fresh store; a row per run, the medians
#       # and the ratio this/before (this machine drifts by a third: only paired runs compare)
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
serve() {  # the command that runs build $1 on this store (port and secret from the bench)
  echo "SABI_CONFIG=/dev/null SABI_LOG=warn SABI_LISTEN=127.0.0.1:\$BENCH_PORT SABI_WHATSAPP_APP_SECRET=\$BENCH_SECRET SABI_MARKER_SECRET=ingest-bench-marker-secret SABI_STORE='$store' exec $1 serve"
}
if [ -z "${SABI_BIN_BEFORE:-}" ]; then
  bash "$shared/compare-ingest.sh" "$(serve "$SABI_BIN")" "$port" bench-secret
  exit
fi

# Paired: the previous build and this one, alternately, on the same store and load.
source "$shared/lib.sh"
mkdir -p "$RUN_DIR" "$TMP_DIR"
paired="$RESULTS_DIR/paired-$(date +%Y%m%d-%H%M%S)"
mkdir -p "$paired"
export LOADGEN_CPU="${LOADGEN_CPU-0}"
server_cpus="${SERVER_CPUS:-$(default_server_cpus)}"
trap 'stop_bg server' EXIT
wipe_store() {
  case "$store" in
    sqlite://*) rm -rf "$BENCH_WORK/sabi-store"; mkdir -p "$BENCH_WORK/sabi-store" ;;
    redis://*) redis-cli -u "${store%%\?*}" flushall >/dev/null ;;
    postgres://*) psql -q "$store" -c "DROP SCHEMA public CASCADE; CREATE SCHEMA public" ;;
  esac
}
run_one() {  # run_one LABEL BIN OUT
  wipe_store
  port_busy "$port" && die "127.0.0.1:$port is busy"
  start_bg server "$server_cpus" env BENCH_PORT="$port" BENCH_SECRET=bench-secret bash -c "$(serve "$2")"
  wait_http "http://127.0.0.1:$port/healthz" 120 || { tail -20 "$RUN_DIR/server.log" >&2; die "$1 did not start"; }
  OUT="$3" LABEL="$1" REPEATS=1 bash "$shared/ingest-bench.sh" \
    "http://127.0.0.1:$port/webhook/whatsapp" bench-secret $RATES >/dev/null
  alive server || die "$1 exited during the benchmark (log: $RUN_DIR/server.log)"
  stop_bg server
  for _ in $(seq 1 50); do port_busy "$port" || break; sleep 0.1; done
}
for round in $(seq 1 "${ROUNDS:-3}"); do
  order=(before this)
  [ $((round % 2)) = 0 ] && order=(this before)
  for which in "${order[@]}"; do
    bin=$SABI_BIN; [ "$which" = before ] && bin=$SABI_BIN_BEFORE
    echo "== round $round: $which ($bin)" >&2
    run_one "$which" "$bin" "$paired/$which-$round"
  done
done
python3 - "$paired" $RATES <<'PY' | tee "$paired/paired.txt"
import json, os, statistics, sys
root, rates = sys.argv[1], [int(r) for r in sys.argv[2:]]
def figures(d):
    s = json.load(open(os.path.join(root, d, "summary.json")))
    closed = next(r for r in s["rows"] if r["load"].startswith("closed"))
    p99 = {int(float(r["load"].split()[1].rstrip("/s"))): r["p99_ms"]
           for r in s["rows"] if r["load"].startswith("open ")}
    return closed["ok_rps"], [p99.get(rate) for rate in rates]
runs = {"before": [], "this": []}
for d in sorted(os.listdir(root), key=lambda d: int(d.rsplit("-", 1)[1]) if "-" in d else 0):
    which = d.rsplit("-", 1)[0]
    if which in runs:
        runs[which].append((d, *figures(d)))
head = f"{'run':<10}{'closed ok/s':>12}" + "".join(f"{'p99 ms @' + str(r):>15}" for r in rates)
print(head)
print("-" * len(head))
fmt = lambda v: "-" if v is None else f"{v:.1f}"
for which in ("before", "this"):
    for d, ok, p99 in runs[which]:
        print(f"{d:<10}{ok:>12.0f}" + "".join(f"{fmt(p):>15}" for p in p99))
med = {w: statistics.median(ok for _, ok, _ in runs[w]) for w in runs}
print(f"median closed ok/s: before {med['before']:.0f}, this {med['this']:.0f}; "
      f"ratio this/before {med['this'] / med['before']:.2f}")
for i, rate in enumerate(rates):
    p = {w: [r[2][i] for r in runs[w] if r[2][i] is not None] for w in runs}
    if p["before"] and p["this"]:
        print(f"median p99 at {rate}/s: before {statistics.median(p['before']):.1f} ms, "
              f"this {statistics.median(p['this']):.1f} ms")
pairs = [t[1] / b[1] for b, t in zip(runs["before"], runs["this"])]
print("per-round ratios: " + ", ".join(f"{r:.2f}" for r in pairs))
PY
echo "results: $paired" >&2
