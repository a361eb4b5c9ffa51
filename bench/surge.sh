#!/usr/bin/env bash
# A broadcast's surge of replies in real time: 2,000 customers against an API node and two
# worker nodes on PostgreSQL, with the fake Graph API and the fake model of `sabi simulate`.
# Then the same inputs through `sabi simulate` (virtual time) and `sabi plan`, side by side:
# customers' first-reply times (p50, p95, max), holding messages, model calls.
#
#   bench/surge.sh
#   AUDIENCE=2000 TURNS_PER_NODE=3 LLM_LATENCY=5,12 bench/surge.sh
#
# The reply curve is the prior's first quarter hour pressed into five minutes (curve.json
# below), so that a run takes about 25 minutes. Needs PostgreSQL (PG_URL, a database is
# created and dropped) and psql. Results go under $BENCH_WORK/surge-<stamp>.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PG_URL="${PG_URL:-postgres://root@127.0.0.1:5432}"
AUDIENCE="${AUDIENCE:-2000}"
TURNS_PER_NODE="${TURNS_PER_NODE:-3}"
LLM_LATENCY="${LLM_LATENCY:-5,12}"
BENCH_WORK="${BENCH_WORK:-/tmp/sabi-bench}"
API_PORT="${API_PORT:-19180}" GRAPH_PORT="${GRAPH_PORT:-19181}" MODEL_PORT="${MODEL_PORT:-19182}"
SLOTS=$((TURNS_PER_NODE * 2))
RES="$BENCH_WORK/surge-$(date +%Y%m%d-%H%M%S)"
mkdir -p "$RES"
db="sabi_surge_$$"

cargo build --release --manifest-path "$here/Cargo.toml" >/dev/null
sabi="$here/target/release/sabi"
psql "$PG_URL/postgres" -qc "CREATE DATABASE $db" >/dev/null

pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  psql "$PG_URL/postgres" -qc "DROP DATABASE IF EXISTS $db" >/dev/null || true
}
trap cleanup EXIT

# First replies per minute: 43 % of a day's replies come in its first quarter hour, most at once.
echo '[120, 60, 40, 30, 20]' > "$RES/curve.json"

export SABI_STORE="$PG_URL/$db"
export SABI_WHATSAPP_APP_SECRET="surge-bench-secret"
export SABI_WHATSAPP_ACCESS_TOKEN="surge-bench-token"
export SABI_MARKER_SECRET="surge-bench-marker-secret"
export SABI_WHATSAPP_API_BASE="http://127.0.0.1:$GRAPH_PORT/v23.0"
export SABI_LLM_BASE_URL="http://127.0.0.1:$MODEL_PORT/v1"
export SABI_LLM_MODEL="simulated"
export SABI_TURNS="$TURNS_PER_NODE"
export SABI_LOG=warn

SABI_LISTEN="127.0.0.1:$API_PORT" "$sabi" serve --role api 2>"$RES/api.log" &
pids+=($!)
for n in 1 2; do
  "$sabi" serve --role worker 2>"$RES/worker-$n.log" &
  pids+=($!)
done
for _ in $(seq 100); do
  curl -fs "http://127.0.0.1:$API_PORT/readyz" >/dev/null 2>&1 && break
  sleep 0.1
done

inputs=(--audience "$AUDIENCE" --messaging-limit unlimited --reply-curve "$RES/curve.json" --llm-latency "$LLM_LATENCY" --slots "$SLOTS")
echo "== real time: $AUDIENCE customers, 2 worker nodes of $TURNS_PER_NODE turns, PostgreSQL" >&2
"$sabi" simulate "${inputs[@]}" --json \
  --webhook "http://127.0.0.1:$API_PORT/webhook/whatsapp" \
  --graph-listen "127.0.0.1:$GRAPH_PORT" --model-listen "127.0.0.1:$MODEL_PORT" > "$RES/real.json"
echo "== sabi simulate, same inputs (virtual time)" >&2
"$sabi" simulate "${inputs[@]}" --json > "$RES/simulated.json"
echo "== sabi plan, same inputs" >&2
"$sabi" plan "${inputs[@]}" --json > "$RES/planned.json"

python3 - "$RES" <<'EOF'
import json, sys
res = sys.argv[1]
real = json.load(open(f"{res}/real.json"))
sim = json.load(open(f"{res}/simulated.json"))["rows"][0]
plan = json.load(open(f"{res}/planned.json"))["rows"][0]
print(f"{'':24}{'answered':>10}{'reply p50':>11}{'p95':>8}{'max':>8}{'holding':>9}{'calls':>7}")
def line(name, c):
    print(f"{name:24}{c['answered']:>10}{c['p50_reply_s']:>10.1f}s{c['p95_reply_s']:>7.1f}s"
          f"{c['max_reply_s']:>7.1f}s{c['holding_messages']:>9}{c['model_calls']:>7}")
line("real time, PostgreSQL", real)
line("sabi simulate", sim["customers"])
print(f"{'sabi plan':24}{plan['turns']:>10}{'':>11}{plan['p95_reply_s']:>7.1f}s{'':>8}"
      f"{plan['holding_messages']:>9}{plan['model_calls']:>7}")
r, s, p = real["p95_reply_s"], sim["customers"]["p95_reply_s"], plan["p95_reply_s"]
print(f"p95 first reply: real / simulate = {r / s:.2f}, plan / simulate = {p / s:.2f}")
EOF
echo "results: $RES" >&2
