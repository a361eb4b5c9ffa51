#!/usr/bin/env bash
# Retention on the embedded store (SQLite, sandbox mode), two measurements in one run (the
# first also on PostgreSQL):
#
#  1. Flat size: a steady load of signed webhooks (RATE a second for STEADY seconds) against a
#     node whose horizons are a minute; the store's files are weighed every 15 s. Past the
#     horizon (messages 60 s, then their keys 60 s more) the size stops growing.
#  2. Ingest while sweeping: a store seeded with TURNS answered turns two days old (a message, a
#     reply, three statuses and the turn itself: 6 x TURNS rows, a million by default), copied twice. The
#     same open-loop load (RATE a second for LOAD seconds) runs against a node for which the
#     rows are past their horizon (the sweeper deletes them meanwhile) and one for which they
#     are not (nothing to sweep), REPEATS times each, alternating: webhook p50/p99 side by side,
#     medians, and how many rows a second the sweep took meanwhile.
#
#   bench/retention.sh
#   RATE=100 STEADY=360 TURNS=170000 LOAD=90 REPEATS=2 bench/retention.sh
#   PG_URL=postgres://root@127.0.0.1:5432 bench/retention.sh   # part 1 on PostgreSQL (a
#                                     # database made and dropped; its size by pg_database_size)
#
# Uses ../shared/bench (setup.sh builds the load generator; gen_requests.py signs the requests).
# Results go under $BENCH_WORK/retention-<stamp>.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
shared="${SABI_SHARED:-$here/../shared}/bench"
export BENCH_WORK="${BENCH_WORK:-/tmp/sabi-bench}"
RATE="${RATE:-100}" STEADY="${STEADY:-360}" TURNS="${TURNS:-170000}" LOAD="${LOAD:-90}"
REPEATS="${REPEATS:-2}" PORT="${PORT:-19280}" SECRET=bench-secret
bash "$shared/setup.sh" >/dev/null
if [ -z "${SABI_BIN:-}" ]; then
  cargo build --release --manifest-path "$here/Cargo.toml" >/dev/null
  SABI_BIN="$here/target/release/sabi"
fi
loadgen="$BENCH_WORK/target/release/loadgen"
out="$BENCH_WORK/retention-$(date +%Y%m%d-%H%M%S)"
mkdir -p "$out"
pid=""
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null || true' EXIT

db=""
if [ -n "${PG_URL:-}" ]; then
  db="sabi_retention_$$"
  psql "$PG_URL/postgres" -qc "CREATE DATABASE $db"
  trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; psql "$PG_URL/postgres" -qc "DROP DATABASE IF EXISTS $db WITH (FORCE)"' EXIT
fi

# start DIR VAR=VALUE...: `sabi serve` on DIR/sabi.db (or the PostgreSQL database) with the
# given settings, until it answers.
start() {
  local dir="$1" store="sqlite://$1/sabi.db"; shift
  [ -n "$db" ] && store="$PG_URL/$db"
  mkdir -p "$dir"
  env "$@" SABI_CONFIG=/dev/null SABI_LOG=info SABI_LISTEN="127.0.0.1:$PORT" \
    SABI_WHATSAPP_APP_SECRET="$SECRET" SABI_MARKER_SECRET=retention-bench-marker-secret SABI_STORE="$store" \
    SABI_BATCH_WINDOW=1s "$SABI_BIN" serve 2>>"$dir/sabi.log" &
  pid=$!
  until curl -sf "http://127.0.0.1:$PORT/healthz" >/dev/null; do sleep 0.1; done
}
stop() { kill -TERM "$pid"; wait "$pid" || true; pid=""; }
bytes() {
  if [ -n "$db" ]; then
    psql "$PG_URL/$db" -Atc "SELECT pg_database_size(current_database())"
  else
    du -cb "$1"/sabi.db* | tail -1 | cut -f1
  fi
}
requests() {
  python3 "$shared/gen_requests.py" --mode webhook --secret "$SECRET" --count "$1" --out "$2" \
    2>/dev/null
}
load() {
  "$loadgen" --url "http://127.0.0.1:$PORT/webhook/whatsapp" --file "$1" --rate "$RATE" \
    --duration "$2" --connections 16 --label "$3" 2>/dev/null
}

echo "== 1. flat size: $RATE webhooks/s for ${STEADY}s, horizons 60 s, swept every 5 s"
steady="$out/steady"
requests $((RATE * (STEADY + 10))) "$out/steady.reqs"
start "$steady" SABI_RETENTION_MESSAGES=60s SABI_RETENTION_STATUSES=60s \
  SABI_RETENTION_QUARANTINE=60s SABI_RETENTION_DEDUPE=60s SABI_SWEEP_EVERY=5s
load "$out/steady.reqs" "$STEADY" steady > "$out/steady.json" &
load_pid=$!
printf 'seconds\tstore_bytes\n' > "$out/steady.tsv"
for ((t = 0; t <= STEADY; t += 15)); do
  printf '%s\t%s\n' "$t" "$(bytes "$steady")" >> "$out/steady.tsv"
  sleep 15
done
wait "$load_pid"
stop
awk -F'\t' 'NR > 1 && $1 % 60 == 0 { printf "  %4d s  %7.1f MB\n", $1, $2 / 1e6 }' "$out/steady.tsv"

if [ -n "$db" ]; then
  echo "results: $out"
  exit 0
fi

echo "== 2. ingest at $RATE/s for ${LOAD}s while sweeping $((6 * TURNS)) expired rows"
seed="$out/seed"
start "$seed"
stop
python3 "$here/bench/retention_seed.py" "$seed/sabi.db" "$TURNS"
echo "  seeded store: $(( $(bytes "$seed") / 1000000 )) MB"
rows() {
  python3 - "$1/sabi.db" <<'EOF'
import sqlite3, sys
db = sqlite3.connect(sys.argv[1])
print(sum(db.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in ("inbox", "outbox", "batches")))
EOF
}
printf 'run\tp50_ms\tp99_ms\tok\trows_swept_per_s\tmb_before\tmb_after\n' > "$out/sweep.tsv"
for ((r = 1; r <= REPEATS; r++)); do
  for run in kept expired; do
    dir="$out/$run-$r"
    mkdir -p "$dir"
    cp "$seed"/sabi.db* "$dir/"
    before=$(bytes "$dir") rows_before=$(rows "$dir")
    requests $((RATE * (LOAD + 10))) "$dir/reqs"
    horizon=3650d
    [ "$run" = expired ] && horizon=1d
    start "$dir" SABI_RETENTION_MESSAGES="$horizon" SABI_RETENTION_STATUSES="$horizon" \
      SABI_SWEEP_EVERY=1s
    load "$dir/reqs" "$LOAD" "$run" > "$dir/load.json"
    stop
    # Each webhook the load sent added a message, a turn and a reply, kept: the rest were swept.
    swept=$(( (rows_before + 3 * RATE * LOAD - $(rows "$dir")) / LOAD ))
    [ "$run" = kept ] && swept=0
    python3 - "$dir/load.json" "$run" "$swept" "$before" "$(bytes "$dir")" >> "$out/sweep.tsv" <<'EOF'
import json, sys
r = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
print("\t".join([sys.argv[2], str(r["p50_ms"]), str(r["p99_ms"]), str(r["ok"]), sys.argv[3],
                 str(int(sys.argv[4]) // 1000000), str(int(sys.argv[5]) // 1000000)]))
EOF
    rm -f "$dir"/sabi.db* "$dir/reqs"
  done
done
column -t "$out/sweep.tsv"
python3 - "$out/sweep.tsv" <<'EOF'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
def median(run, field):
    return statistics.median(float(r[field]) for r in rows if r["run"] == run)
for field in ("p50_ms", "p99_ms"):
    kept, swept = median("kept", field), median("expired", field)
    print(f"  median {field}: nothing to sweep {kept:.2f}, sweeping {swept:.2f} (x{swept / kept:.2f})")
EOF
echo "results: $out"
