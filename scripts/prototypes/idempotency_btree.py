#!/usr/bin/env python3
# Issue 35 prototype (not used by Herald): `python3 idempotency_btree.py [PRELOAD]`.
# Bytes written per idempotency key for index layouts, SQLite WAL mode, synchronous=NORMAL,
# checkpoints included (wal_autocheckpoint default 1000 pages): what each layout costs at
# steady state over an index of PRELOAD keys.
import os, sqlite3, sys, uuid, hashlib, time, tempfile
PRELOAD = int(sys.argv[1]) if len(sys.argv) > 1 else 500_000
N = 100_000
def io():
    for l in open("/proc/self/io"):
        if l.startswith("write_bytes"): return int(l.split()[1])
def db(page, path):
    c = sqlite3.connect(path, isolation_level=None)
    c.execute(f"PRAGMA page_size={page}"); c.execute("PRAGMA journal_mode=WAL"); c.execute("PRAGMA synchronous=NORMAL")
    return c
scope = "admin\nPOST /api/v1/app/app_2b3kQ9a1ZCpkFw2SgJnaMSV9oPk/msg"
def run(name, page, keyf, ddl, batch, sort):
    d = tempfile.mkdtemp(dir="/var/tmp"); c = db(page, d + "/x.db"); c.execute(ddl)
    c.execute("BEGIN")
    for i in range(PRELOAD): c.execute("INSERT INTO k VALUES (?, ?)", (keyf(str(uuid.uuid4())), i))
    c.execute("COMMIT"); c.execute("PRAGMA wal_checkpoint(TRUNCATE)"); os.sync()
    keys = [keyf(str(uuid.uuid4())) for _ in range(N)]
    b0, t0 = io(), time.process_time()
    for s in range(0, N, batch):
        chunk = keys[s:s+batch]
        if sort: chunk = sorted(chunk)
        c.execute("BEGIN")
        for j, k in enumerate(chunk): c.execute("INSERT INTO k VALUES (?, ?)", (k, PRELOAD + s + j))
        c.execute("COMMIT")
    c.execute("PRAGMA wal_checkpoint(TRUNCATE)"); c.close(); os.sync()
    b1, t1 = io(), time.process_time()
    print(f"{name:58s} {(b1-b0)/N:8.0f} B/key {1e6*(t1-t0)/N:6.1f} us/key (python incl.)", flush=True)
text = lambda k: scope + "\n" + k
h16 = lambda k: hashlib.blake2b((scope + "\n" + k).encode(), digest_size=16).digest()
print(f"index preloaded with {PRELOAD} keys, {N} inserts measured")
run("4 KiB pages, (scope,key) text, commit of 30 (today)", 4096, text, "CREATE TABLE k (sk TEXT PRIMARY KEY, seq INT) WITHOUT ROWID", 30, False)
run("4 KiB pages, (scope,key) text, sorted pass of 1000", 4096, text, "CREATE TABLE k (sk TEXT PRIMARY KEY, seq INT) WITHOUT ROWID", 1000, True)
run("4 KiB pages, 16 B hash, commit of 30", 4096, h16, "CREATE TABLE k (h BLOB PRIMARY KEY, seq INT) WITHOUT ROWID", 30, False)
run("512 B pages, 16 B hash, commit of 30", 512, h16, "CREATE TABLE k (h BLOB PRIMARY KEY, seq INT) WITHOUT ROWID", 30, False)
run("512 B pages, 16 B hash, sorted pass of 1000", 512, h16, "CREATE TABLE k (h BLOB PRIMARY KEY, seq INT) WITHOUT ROWID", 1000, True)
