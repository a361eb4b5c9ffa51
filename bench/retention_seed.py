#!/usr/bin/env python3
"""Fills a SQLite store that `sabi serve` created with rows long past their retention, as a busy
store holds them: answered turns (one ~1 KB message and one reply each) and three delivery
statuses per reply, all two days old. bench/retention.sh then measures ingest while the sweeper
deletes them.

    retention_seed.py STORE.db TURNS

Standard library only.
"""
import hashlib
import sqlite3
import sys
import time

BUSINESS = "106540352242922"
CUSTOMERS = 10_000
TEXT = ("hello I paid already could you tell me when my package will arrive " * 9)[:560]


def main() -> None:
    path, turns = sys.argv[1], int(sys.argv[2])
    old = int(time.time() * 1000) - 2 * 86_400_000
    db = sqlite3.connect(path)
    db.execute("PRAGMA journal_mode = WAL")
    db.execute("BEGIN")
    db.executemany(
        "INSERT INTO conversations (id, channel, business, customer, last_inbound_at) "
        "VALUES (?, 'whatsapp', ?, ?, ?)",
        ((c + 1, BUSINESS, f"2348{c:09d}", old) for c in range(CUSTOMERS)),
    )
    db.executemany(
        "INSERT INTO batches (id, conversation_id, state, token, attempts, due_at, created_at, "
        "started_at, finished_at) VALUES (?, ?, 'done', 1, 1, ?, ?, ?, ?)",
        ((b + 1, b % CUSTOMERS + 1, old, old, old, old) for b in range(turns)),
    )

    def items():
        for b in range(turns):
            customer = f"2348{b % CUSTOMERS:09d}"
            key = f"wamid.seed-in-{b}"
            yield (
                key, "message", customer, "text", TEXT, old, "answered", b % CUSTOMERS + 1, b + 1,
                hashlib.sha256(key.encode()).digest(), f'{{"id":"{key}","text":"{TEXT}"}}',
            )
            for status in ("sent", "delivered", "read"):
                skey = f"wamid.seed-out-{b}:{status}"
                yield (
                    skey, "status", customer, None, None, old, "recorded", None, None,
                    hashlib.sha256(skey.encode()).digest(), f'{{"status":"{status}"}}',
                )

    db.executemany(
        "INSERT INTO inbox (channel, dedupe_key, kind, business, customer, item_type, text, "
        "received_at, state, conversation_id, batch_id, content_hash, facts) "
        f"VALUES ('whatsapp', ?, ?, '{BUSINESS}', ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        items(),
    )
    db.executemany(
        "INSERT INTO outbox (batch_id, part, channel, business, customer, body, state, created_at, "
        "conversation_id, updated_at, wamid, delivery) "
        "VALUES (?, 0, 'whatsapp', ?, ?, ?, 'accepted', ?, ?, ?, ?, 'read')",
        (
            (b + 1, BUSINESS, f"2348{b % CUSTOMERS:09d}", "Your order left the store.", old,
             b % CUSTOMERS + 1, old, f"wamid.seed-out-{b}")
            for b in range(turns)
        ),
    )
    db.commit()
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    rows = db.execute(
        "SELECT (SELECT count(*) FROM inbox) + (SELECT count(*) FROM outbox) "
        "+ (SELECT count(*) FROM batches)"
    ).fetchone()[0]
    print(f"seeded {rows} rows two days old into {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
