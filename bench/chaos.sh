#!/usr/bin/env bash
# No silence after a crash (issue #34): customers of `sabi simulate` write in real time to an
# API node and two worker nodes while a worker is killed with `kill -9` every 60-120 s (random)
# and restarted, and the store is restarted once mid-run. Then, from outside with the sabi CLI
# (`sabi inbox`, `sabi outbox`, `sabi review ls`), one verdict line per check:
#
#   nothing lost       every customer message stored is answered, in review or skipped; none pending
#   nothing doubled    no reply part twice: one outbox row per (reply, part), no wamid twice
#   nobody silent      every customer who wrote got a reply part accepted, or is in review
#   nobody waits       no customer has a queued part of a later reply behind an unknown part
#   unknown parts      sends a kill left without an answer (at most the kills' requests on the
#                      wire), and how each ended: settled by Meta's status, or with a person
#
# The fake Graph API answers a send in GRAPH_LATENCY seconds (P50,P95, default 0.3,1.5, about
# Meta's), so kills land mid-request, and sends Meta's `sent` status webhook a second after
# each answer (GRAPH_STATUSES=0: none, so a send a kill caught mid-request stays unknown and
# goes to a person).
#
# Exits 1 when a check fails.
#
#   STORE=redis bench/chaos.sh                  # private redis-server (appendonly yes), free port
#   STORE=postgres bench/chaos.sh               # private cluster (initdb/pg_ctl as user postgres)
#   STORE=sqlite bench/chaos.sh                 # one `--role all` node on a file, killed instead
#   SHORT=1 STORE=redis bench/chaos.sh          # about 4 minutes: DURATION=150 AUDIENCE=60
#   DURATION=600 AUDIENCE=300 STORE=redis bench/chaos.sh
#
# DURATION (seconds, default 600) is how long the crowd writes and the kills go on; then the
# nodes settle (at most SETTLE seconds, default 240) before the checks. SABI_BIN runs another
# build. When no private PostgreSQL cluster can be started, PG_URL's server is used (a database
# is created and dropped) and the store is not restarted; the output says so. Results go under
# $BENCH_WORK/chaos-<store>-<stamp>.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STORE="${STORE:-redis}"
if [[ -n "${SHORT:-}" ]]; then
  DURATION="${DURATION:-150}" AUDIENCE="${AUDIENCE:-60}" SETTLE="${SETTLE:-150}"
  # A lost send goes to review after this; shortened so that a short run settles.
  export SABI_UNKNOWN_OUTCOME_WAIT="${SABI_UNKNOWN_OUTCOME_WAIT:-20s}"
fi
DURATION="${DURATION:-600}"
AUDIENCE="${AUDIENCE:-300}"
SETTLE="${SETTLE:-240}"
TURNS_PER_NODE="${TURNS_PER_NODE:-4}"
LLM_LATENCY="${LLM_LATENCY:-2,6}"
GRAPH_LATENCY="${GRAPH_LATENCY:-0.3,1.5}"
GRAPH_STATUSES="${GRAPH_STATUSES:-1}"
PG_URL="${PG_URL:-postgres://root@127.0.0.1:5432}"
BENCH_WORK="${BENCH_WORK:-/tmp/sabi-bench}"
RES="$BENCH_WORK/chaos-$STORE-$(date +%Y%m%d-%H%M%S)"
mkdir -p "$RES"
chmod 755 "$BENCH_WORK" "$RES"

sabi="${SABI_BIN:-$here/target/release/sabi}"
if [[ -z "${SABI_BIN:-}" && ! -x "$sabi" ]]; then
  cargo build --release --manifest-path "$here/Cargo.toml" >/dev/null
fi

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
API_PORT="$(free_port)" GRAPH_PORT="$(free_port)" MODEL_PORT="$(free_port)"
log() { echo "[$(date +%H:%M:%S)] $*" | tee -a "$RES/events.log" >&2; }

pids=()          # everything to stop at the end
store_pid=""     # the private store's process, restarted once
pg_dir="" pg_port="" pg_shared_db=""
as_postgres() { runuser -u postgres -- "$@"; }
cleanup() {
  set +e
  for pid in "${pids[@]}" ${node_pids[@]+"${node_pids[@]}"} $store_pid; do
    kill "$pid" 2>/dev/null
  done
  if [[ -n "$pg_dir" ]]; then as_postgres "$pg_bin/pg_ctl" -D "$pg_dir/data" -m immediate stop >/dev/null 2>&1; fi
  if [[ -n "$pg_shared_db" ]]; then psql "$PG_URL/postgres" -qc "DROP DATABASE IF EXISTS $pg_shared_db" >/dev/null 2>&1; fi
  wait 2>/dev/null
  if [[ -n "$pg_dir" ]]; then rm -rf "$pg_dir"; fi
}
trap cleanup EXIT

# ---- the store -------------------------------------------------------------------------------
store_restartable=1
case "$STORE" in
  redis)
    redis_port="$(free_port)"
    mkdir -p "$RES/redis"
    start_store() {
      redis-server --port "$redis_port" --bind 127.0.0.1 --dir "$RES/redis" --appendonly yes \
        --save "" --daemonize no --logfile "$RES/redis/redis.log" &
      store_pid=$!
      for _ in $(seq 100); do
        redis-cli -p "$redis_port" ping >/dev/null 2>&1 && return 0
        sleep 0.1
      done
      log "redis-server did not start"; return 1
    }
    stop_store() {   # SIGTERM: redis writes its append-only file and exits
      kill "$store_pid"; wait "$store_pid" 2>/dev/null || true
    }
    start_store
    export SABI_STORE="redis://127.0.0.1:$redis_port"
    store_desc="private redis-server on port $redis_port (appendonly yes)"
    ;;
  postgres)
    pg_bin="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)"
    pg_port="$(free_port)"
    if [[ -n "$pg_bin" && "$(id -u)" == 0 ]] && id postgres >/dev/null 2>&1; then
      pg_dir="$(mktemp -d /tmp/sabi-chaos-pg.XXXXXX)"
      chown postgres "$pg_dir"
      if ! as_postgres "$pg_bin/initdb" -D "$pg_dir/data" -U postgres --auth=trust >"$RES/initdb.log" 2>&1; then
        rm -rf "$pg_dir"; pg_dir=""
      fi
    elif [[ -n "$pg_bin" && "$(id -u)" != 0 ]]; then
      pg_dir="$(mktemp -d /tmp/sabi-chaos-pg.XXXXXX)"
      as_postgres() { "$@"; }
      "$pg_bin/initdb" -D "$pg_dir/data" -U postgres --auth=trust >"$RES/initdb.log" 2>&1 \
        || { rm -rf "$pg_dir"; pg_dir=""; }
    fi
    if [[ -n "$pg_dir" ]]; then
      start_store() {
        as_postgres "$pg_bin/pg_ctl" -D "$pg_dir/data" -l "$pg_dir/postgres.log" -w \
          -o "-p $pg_port -k $pg_dir -c listen_addresses=127.0.0.1" start >/dev/null
      }
      stop_store() {   # fast: connections are cut, the cluster shuts down cleanly
        as_postgres "$pg_bin/pg_ctl" -D "$pg_dir/data" -m fast -w stop >/dev/null
      }
      start_store
      psql "postgres://postgres@127.0.0.1:$pg_port/postgres" -qc "CREATE DATABASE sabi" >/dev/null
      export SABI_STORE="postgres://postgres@127.0.0.1:$pg_port/sabi"
      store_desc="private PostgreSQL cluster on port $pg_port ($pg_bin)"
    else
      pg_shared_db="sabi_chaos_$$"
      psql "$PG_URL/postgres" -qc "CREATE DATABASE $pg_shared_db" >/dev/null
      export SABI_STORE="$PG_URL/$pg_shared_db"
      store_restartable=0
      store_desc="PG_URL's server (no private cluster could be started): the store is NOT restarted"
    fi
    ;;
  sqlite)
    export SABI_STORE="sqlite://$RES/sabi.db"
    store_restartable=0
    store_desc="SQLite file, one --role all node (no separate store to restart)"
    ;;
  *) echo "STORE must be redis, postgres or sqlite" >&2; exit 2 ;;
esac

export SABI_WHATSAPP_APP_SECRET="chaos-bench-secret"
export SABI_WHATSAPP_ACCESS_TOKEN="chaos-bench-token"
export SABI_MARKER_SECRET="chaos-bench-marker-secret"
export SABI_WHATSAPP_API_BASE="http://127.0.0.1:$GRAPH_PORT/v23.0"
export SABI_LLM_BASE_URL="http://127.0.0.1:$MODEL_PORT/v1"
export SABI_LLM_MODEL="simulated"
export SABI_TURNS="$TURNS_PER_NODE"
export SABI_LOG="${SABI_LOG:-warn}"

# ---- the nodes -------------------------------------------------------------------------------
# node_pids[i] and node_role[i]: the sqlite run has one node of role all, the others an API node
# (never killed) and two workers.
declare -a node_pids node_role
if [[ "$STORE" == sqlite ]]; then node_role=(all); else node_role=(api worker worker); fi
start_node() {
  local i=$1 role=${node_role[$1]}
  if [[ "$role" == worker ]]; then
    "$sabi" serve --role worker 2>>"$RES/node-$i.log" &
  else
    SABI_LISTEN="127.0.0.1:$API_PORT" "$sabi" serve --role "$role" 2>>"$RES/node-$i.log" &
  fi
  node_pids[i]=$!
}
wait_ready() {
  for _ in $(seq 300); do
    curl -fs "http://127.0.0.1:$API_PORT/readyz" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  log "the API node is not ready after 30 s"
}
for i in "${!node_role[@]}"; do start_node "$i"; done
wait_ready

# ---- the crowd -------------------------------------------------------------------------------
# Every customer replies (rate 1), within a minute of their message; the sends are spread so
# that first replies come over the run's first part and follow-ups fill the rest.
send_over=$(( DURATION > 180 ? DURATION - 120 : DURATION / 3 ))
echo '[1]' > "$RES/curve.json"
log "chaos on $STORE: $store_desc; $AUDIENCE customers over ${send_over}s, kills for ${DURATION}s; results in $RES"
"$sabi" simulate --audience "$AUDIENCE" --messaging-limit unlimited --reply-rate 1 --reply-curve "$RES/curve.json" \
  --turns-per-customer 1.5 --send-over "${send_over}s" --llm-latency "$LLM_LATENCY" \
  --slots $((TURNS_PER_NODE * 2)) --json \
  --webhook "http://127.0.0.1:$API_PORT/webhook/whatsapp" \
  --graph-listen "127.0.0.1:$GRAPH_PORT" --model-listen "127.0.0.1:$MODEL_PORT" \
  --graph-latency "$GRAPH_LATENCY" $([[ "$GRAPH_STATUSES" == 1 ]] && echo --graph-statuses) \
  >"$RES/simulate.json" 2>"$RES/simulate.log" &
crowd=$!
pids+=("$crowd")

# ---- the chaos -------------------------------------------------------------------------------
start=$SECONDS
kills=0 store_restarts=0
# The first kill: 60-120 s in, like the others (30-60 s in short mode, so that it has two).
if [[ -n "${SHORT:-}" ]]; then next_kill=$(( 30 + RANDOM % 31 )); else next_kill=$(( 60 + RANDOM % 61 )); fi
store_at=$(( DURATION / 2 ))
[[ "$store_restartable" == 1 ]] || store_at=-1
while (( SECONDS - start < DURATION )); do
  sleep 1
  t=$(( SECONDS - start ))
  if (( store_at >= 0 && t >= store_at )); then
    store_at=-1
    log "t=${t}s: store stopped"
    stop_store
    sleep 2
    start_store
    store_restarts=$((store_restarts + 1))
    log "t=$(( SECONDS - start ))s: store started again"
  fi
  if (( t >= next_kill )); then
    if [[ "$STORE" == sqlite ]]; then i=0; else i=$(( 1 + RANDOM % 2 )); fi
    kill -9 "${node_pids[i]}"
    wait "${node_pids[i]}" 2>/dev/null || true
    kills=$((kills + 1))
    log "t=${t}s: kill -9 node $i (${node_role[i]})"
    sleep 1
    start_node "$i"
    [[ "${node_role[i]}" == worker ]] || wait_ready
    log "t=$(( SECONDS - start ))s: node $i restarted"
    next_kill=$(( t + 60 + RANDOM % 61 ))
  fi
done
log "kills over after ${DURATION}s: $kills kill(s), $store_restarts store restart(s); settling (at most ${SETTLE}s)"

# ---- settle ----------------------------------------------------------------------------------
# Settled: the crowd is done, or nothing is pending, batched, queued, claimed, sending or unknown
# for three polls in a row (a later part behind an unknown one is still queued until it is
# reviewed, hence unknown counts as unsettled until SETTLE runs out).
unsettled() {
  { "$sabi" inbox --json --kind message 2>/dev/null || true; } \
    | grep -cE '"state":"(pending|batched)"' || true
  { "$sabi" outbox --json 2>/dev/null || true; } \
    | grep -cE '"state":"(queued|claimed|sending|unknown)"' || true
}
quiet=0 settle_start=$SECONDS
while (( SECONDS - settle_start < SETTLE )); do
  if ! kill -0 "$crowd" 2>/dev/null; then log "the crowd is done"; break; fi
  counts="$(unsettled | paste -sd' ')"
  if [[ "$counts" == "0 0" ]]; then quiet=$((quiet + 1)); else quiet=0; fi
  (( quiet >= 3 )) && { log "settled: nothing in flight (the crowd has not ended)"; break; }
  sleep 5
done
log "settled after $(( SECONDS - settle_start ))s; checking"

checked_at_ms="$(date +%s%3N)"
"$sabi" inbox --json --kind message >"$RES/inbox.jsonl"
"$sabi" outbox --json >"$RES/outbox.jsonl"
"$sabi" review ls --json >"$RES/review.jsonl"
if kill -0 "$crowd" 2>/dev/null; then
  kill "$crowd"; wait "$crowd" 2>/dev/null || true
  crowd_done=0
else
  wait "$crowd" 2>/dev/null || true
  crowd_done=1
fi

python3 - "$RES" "$STORE" "$kills" "$store_restarts" "$crowd_done" "$DURATION" "$AUDIENCE" "$checked_at_ms" <<'EOF'
import collections, json, sys
res, store, kills, restarts, crowd_done, duration, audience, checked_at = sys.argv[1:9]
# A message that came in this shortly before the check is in flight (the crowd still writes).
IN_FLIGHT_MS = 30_000
kills, restarts = int(kills), int(restarts)
def lines(name):
    return [json.loads(l) for l in open(f"{res}/{name}") if l.strip()]
inbox, outbox, review = lines("inbox.jsonl"), lines("outbox.jsonl"), lines("review.jsonl")
crowd = None
if crowd_done == "1":
    try:
        crowd = json.load(open(f"{res}/simulate.json"))
    except (OSError, ValueError):
        pass

msg_states = collections.Counter(m["state"] for m in inbox)
part_states = collections.Counter(p["state"] for p in outbox)
review_reasons = collections.Counter(r.get("reason") for r in review)
failed = []
def verdict(name, ok, detail):
    print(f"{'PASS' if ok else 'FAIL'}  {name:<16} {detail}")
    if not ok:
        failed.append(name)

print(f"chaos {store}: {duration}s, {audience} customers, {kills} {'node' if store == 'sqlite' else 'worker'} kill(s) (kill -9), "
      f"{restarts} store restart(s)")
def counted(name, total, counts):
    print(f"  {name} {total}" + "".join(f", {k} {v}" for k, v in sorted(counts.items())))
counted("messages", len(inbox), msg_states)
counted("parts", len(outbox), part_states)
counted("review items", len(review), review_reasons)
if crowd:
    print(f"  crowd: wrote {crowd['messages']}, answered {crowd['answered']}, reply p50 "
          f"{crowd['p50_reply_s']:.1f}s p95 {crowd['p95_reply_s']:.1f}s max {crowd['max_reply_s']:.1f}s, "
          f"holding {crowd['holding_messages']}, model calls {crowd['model_calls']}")
else:
    print("  crowd: not ended when the checks ran (stopped, so no report of its own)")

# nothing lost
open_msgs = [m for m in inbox if m["state"] in ("pending", "batched")]
in_flight = [m for m in open_msgs if int(checked_at) - m["received_at_ms"] < IN_FLIGHT_MS]
open_msgs = [m for m in open_msgs if m not in in_flight]
ok_states = {"answered", "review", "skipped", "withdrawn"}
odd = [m for m in inbox if m["state"] not in ok_states | {"pending", "batched"}]
verdict("nothing lost", not open_msgs and not odd,
        f"{len(inbox)} messages stored: {msg_states['answered']} answered, {msg_states['review']} in review, "
        f"{msg_states['skipped'] + msg_states['withdrawn']} skipped; {len(open_msgs)} pending or batched"
        + (f" (and {len(in_flight)} that came in the last {IN_FLIGHT_MS // 1000} s, in flight)" if in_flight else "")
        + (f", {len(odd)} in another state" if odd else ""))
if crowd and crowd["messages"] != len(inbox):
    print(f"      note: the crowd wrote {crowd['messages']}, the store holds {len(inbox)}")

# nothing doubled
by_part = collections.Counter((p["channel"], p["customer"], p["batch"], p["part"]) for p in outbox)
dup_parts = [k for k, n in by_part.items() if n > 1]
wamids = collections.Counter(p["wamid"] for p in outbox if p.get("wamid"))
dup_wamids = [w for w, n in wamids.items() if n > 1]
# The same text to the same customer for the same message twice would be a turn answered twice.
by_text = collections.Counter((p["customer"], p["batch"], p["text"]) for p in outbox
                              if p["state"] == "accepted")
reclaimed = sum(1 for p in outbox if p["state"] == "accepted" and p["attempts"] > 1)
batches_per_msg = collections.defaultdict(set)
for m in inbox:
    if m.get("batch") is not None:
        batches_per_msg[m["id"]].add(m["batch"])
verdict("nothing doubled", not dup_parts and not dup_wamids and max(by_text.values(), default=1) == 1,
        f"{len(dup_parts)} (reply, part) written twice, {len(dup_wamids)} wamids twice, "
        f"{sum(1 for n in by_text.values() if n > 1)} texts sent twice for one reply; "
        f"{reclaimed} accepted parts claimed more than once (a claim lapsed before the send)")

# nobody silent
wrote = {m["customer"] for m in inbox}
replied = {p["customer"] for p in outbox if p["state"] == "accepted"}
in_review = {r.get("customer") for r in review} | {m["customer"] for m in inbox if m["state"] == "review"}
unknown_only = {p["customer"] for p in outbox if p["state"] in ("unknown", "review")} - replied - in_review
silent = wrote - replied - in_review
verdict("nobody silent", not silent,
        f"{len(wrote)} customers wrote: {len(wrote & replied)} got a reply, "
        f"{len((wrote - replied) & in_review)} only in review, {len(silent)} silent"
        + (f" ({len(silent & unknown_only)} of them with a part unknown)" if silent else ""))

# nobody waits behind an unknown part
held = 0
blocked = []
by_customer = collections.defaultdict(list)
for p in outbox:
    by_customer[p["customer"]].append(p)
for customer, parts in by_customer.items():
    unknown_batches = [p["batch"] for p in parts if p["state"] in ("unknown", "review")]
    if not unknown_batches:
        continue
    first = min(unknown_batches)
    for p in parts:
        if p["state"] in ("queued", "claimed"):
            if p["batch"] == first:
                held += 1
            elif p["batch"] > first:
                blocked.append((customer, p["batch"], p["part"]))
verdict("nobody waits", not blocked,
        f"{len(blocked)} queued parts of a later reply behind an unknown part; "
        f"{held} parts held behind an unknown part of their own reply")

# unknown parts: the nodes log each send whose lease lapsed with no answer
import glob, re
lapsed = set()
for name in glob.glob(f"{res}/node-*.log"):
    for line in open(name, errors="replace"):
        if "lease lapsed with no outcome" in line:
            found = re.search(r"outbox[=:]\s*(\d+)", line)
            if found:
                lapsed.add(int(found.group(1)))
by_id = {p["id"]: p for p in outbox}
ended = collections.Counter(by_id[i]["state"] if i in by_id else "gone" for i in lapsed)
unknown_now = part_states["unknown"]
unknown_review = review_reasons["unknown_outcome"]
print(f"INFO  unknown parts    {len(lapsed)} send(s) a kill left without an answer over {kills} kill(s) "
      f"and {restarts} store restart(s); now " + (", ".join(f"{k} {v}" for k, v in sorted(ended.items())) or "none")
      + f"; {unknown_now} part(s) still unknown, {unknown_review} review item(s) unknown_outcome")
print("RESULT " + ("FAIL: " + ", ".join(failed) if failed else "PASS"))
sys.exit(1 if failed else 0)
EOF
