#!/usr/bin/env python3
"""Which B-trees a stretch of SQLite writes: counts the WAL frames appended after a copy of the
WAL taken earlier, by the table or index that owns each page.

    python3 bench/wal_pages.py DB WAL_BEFORE

DB is the database (its -wal beside it, from a process killed with -9 so that nothing was
checkpointed since WAL_BEFORE was copied). The writer must run with `PRAGMA wal_autocheckpoint
= 0`, or a checkpoint restarts the WAL under the count. Needs Python's sqlite3 with dbstat.
"""
import collections
import shutil
import sqlite3
import struct
import sys
import tempfile
from pathlib import Path

db, before = Path(sys.argv[1]), Path(sys.argv[2])
wal = Path(str(db) + "-wal").read_bytes()
page_size = struct.unpack(">I", wal[8:12])[0]
frame = 24 + page_size
start = (before.stat().st_size - 32) // frame
frames = (len(wal) - 32) // frame
written, commits = collections.Counter(), 0
for i in range(start, frames):
    page, size_after = struct.unpack(">II", wal[32 + i * frame:40 + i * frame])
    written[page] += 1
    commits += size_after != 0
with tempfile.TemporaryDirectory() as tmp:
    # A copy: opening the database folds its WAL in.
    copy = Path(tmp) / "copy.db"
    shutil.copy(db, copy)
    shutil.copy(str(db) + "-wal", str(copy) + "-wal")
    conn = sqlite3.connect(copy)
    owner = dict(conn.execute("SELECT pageno, name FROM dbstat"))
by = collections.Counter()
for page, count in written.items():
    by[owner.get(page, "(pointer map or freelist)")] += count
total = sum(by.values())
print(f"{total} frames, {commits} commits, {len(written)} distinct pages of {page_size} bytes")
for name, count in by.most_common():
    print(f"{name:<36}{count:>9}{100 * count / total:>7.1f} %")
