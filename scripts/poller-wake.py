#!/usr/bin/env python3
"""How soon a long-polling poller consumer hears of a message: starts `herald serve` (SQLite,
in /tmp/lp/data), then 30 times: a consumer waits (wait_ms=30000), a message is posted, and
the time from the 202 (committed) to the consumer's answer is taken. Usage:
    scripts/poller-wake.py target/release/herald
"""
import json, os, statistics, subprocess, sys, tempfile, threading, time, urllib.request
binary = sys.argv[1]
env = dict(os.environ, HERALD_DATA_DIR=tempfile.mkdtemp(), HERALD_LISTEN="127.0.0.1:0", HERALD_ADMIN_TOKEN="t0ken-for-bench-1234567890", RUST_LOG="info")
p = subprocess.Popen([binary, "serve"], env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
addr = None
for line in p.stderr:
    if "addr=" in line:
        addr = line.split("addr=")[1].split()[0]; break
threading.Thread(target=lambda: [None for _ in p.stderr], daemon=True).start()
base = f"http://{addr}"
def call(method, path, body=None):
    req = urllib.request.Request(base + path, method=method, data=json.dumps(body).encode() if body is not None else None,
        headers={"authorization": "Bearer t0ken-for-bench-1234567890", "content-type": "application/json"})
    return json.loads(urllib.request.urlopen(req, timeout=60).read() or "null")
app = call("POST", "/api/v1/app", {"name": "lp"})["id"]
poller = call("POST", f"/api/v1/app/{app}/poller", {})["id"]
it = None
delays = []
for i in range(30):
    result = {}
    def poll():
        q = f"?wait_ms=30000" + (f"&iterator={it}" if it else "")
        result["page"] = call("GET", f"/api/v1/app/{app}/poller/{poller}/consumer/c{q}")
        result["at"] = time.perf_counter()
    t = threading.Thread(target=poll); t.start()
    time.sleep(0.2)
    call("POST", f"/api/v1/app/{app}/msg", {"eventType": "e", "payload": {"i": i}})
    committed = time.perf_counter()
    t.join()
    assert len(result["page"]["data"]) == 1, result
    it = result["page"]["iterator"]
    delays.append((result["at"] - committed) * 1000)
p.terminate()
delays.sort()
print(f"wake after the 202 (ms): median {statistics.median(delays):.2f}, p90 {delays[int(len(delays)*0.9)]:.2f}, max {max(delays):.2f}, n={len(delays)}")
