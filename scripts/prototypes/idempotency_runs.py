#!/usr/bin/env python3
# Issue 35 prototype (not used by Herald): `python3 idempotency_runs.py RUN_KEYS RUNS`.
# The log-structured alternative: keys kept in memory for a period, then written sorted
# as a new run (a fresh WITHOUT ROWID table); a lookup probes every run. Bytes per key
# written, and the lookup's cost against the number of runs.
import os, sqlite3, sys, uuid, hashlib, time, tempfile
RUN = int(sys.argv[1]); RUNS = int(sys.argv[2])
def io():
    for l in open("/proc/self/io"):
        if l.startswith("write_bytes"): return int(l.split()[1])
d = tempfile.mkdtemp(dir="/var/tmp"); c = sqlite3.connect(d + "/x.db", isolation_level=None)
c.execute("PRAGMA journal_mode=WAL"); c.execute("PRAGMA synchronous=NORMAL")
h16 = lambda: hashlib.blake2b(str(uuid.uuid4()).encode(), digest_size=16).digest()
os.sync(); b0 = io(); seq = 0
for r in range(RUNS):
    keys = sorted(h16() for _ in range(RUN))
    c.execute("BEGIN"); c.execute(f"CREATE TABLE run{r} (h BLOB PRIMARY KEY, seq INT) WITHOUT ROWID")
    c.executemany(f"INSERT INTO run{r} VALUES (?, ?)", [(k, seq + i) for i, k in enumerate(keys)]); seq += RUN
    c.execute("COMMIT")
c.execute("PRAGMA wal_checkpoint(TRUNCATE)"); os.sync(); b1 = io()
print(f"runs of {RUN}: {(b1-b0)/(RUN*RUNS):.0f} B/key written")
stmts = [f"SELECT seq FROM run{r} WHERE h = ?" for r in range(RUNS)]
probe = [h16() for _ in range(2000)]
t0 = time.perf_counter()
for k in probe:
    for s in stmts: c.execute(s, (k,)).fetchone()
t = (time.perf_counter() - t0) / len(probe)
print(f"a missing key's lookup over {RUNS} runs: {t*1e6:.0f} us ({t*1e6/RUNS:.1f} us per run, python incl.)")
