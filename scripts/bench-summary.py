#!/usr/bin/env python3
"""Summarises a bench-results/*.jsonl file (from scripts/bench-all.sh) as Markdown: per
scenario, the median and range over its runs of the main figures."""

import json
import statistics
import sys
from collections import defaultdict


def figure(report, path):
    value = report
    for key in path.split("."):
        if isinstance(value, list):
            value = next((g for g in value if g.get("group") == key), None)
        elif isinstance(value, dict):
            value = value.get(key)
        if value is None:
            return None
    return value


LATENCY = [("p50 ms", "latencyMs.p50", 2), ("p99 ms", "latencyMs.p99", 1)]

COLUMNS = [
    ("achieved msg/s", "achievedRate", 0),
    *LATENCY,
    ("ack p99 ms", "ackLatencyMs.p99", 1),
    ("CPU µs/msg", "cpuMicrosPerMessage", 0),
    ("bench CPU µs/msg", "benchCpuMicrosPerMessage", 0),
    ("peak RSS MB", "peakRssBytes", -6),
    ("written B/msg", "bytesWrittenPerMessage", 0),
    ("disk probe fsync/s", "diskProbeFsyncPerSecond", 0),
    ("missing", "ledger.missing", 0),
]

# The HTTP floor has no server and no ledger: one exchange's cost instead.
FLOOR_COLUMNS = [
    ("achieved exchanges/s", "achievedRate", 0),
    *LATENCY,
    ("CPU µs/exchange", "cpuMicrosPerExchange", 1),
    ("rig ceiling msg/s", "rigCeiling", 0),
]

EXTRA = {
    "ramp": [("max sustained msg/s", "details.maxSustainedRate", 0)],
    "noisyneighbour": [
        ("healthy alone p99 ms", "details.healthyAloneP99Ms", 1),
        ("healthy w/ noisy p99 ms", "details.healthyWithNoisyP99Ms", 1),
        ("ratio", "details.p99Ratio", 2),
        ("noisy most in flight", "details.noisyMostInFlight", 0),
    ],
    "slowendpoints": [("fast endpoints p99 ms", "groups.fast endpoints.latencyMs.p99", 1)],
    "backlog": [
        ("RSS with 1M pending MB", "details.rssWithBacklogBytes", -6),
        ("drain deliveries/s", "details.drainRate", 0),
        ("summary call ms (1M pending)", "details.summaryCallMsWithBacklog", 1),
    ],
    "burst": [("ingest failures", "ingestFailures", 0)],
}


def cell(values, digits):
    values = [v for v in values if v is not None]
    if not values:
        return "n/a"
    scale = 10 ** -digits if digits < 0 else 1
    values = [v / scale for v in values]
    places = max(digits, 0)
    median = statistics.median(values)
    if len(values) == 1 or min(values) == max(values):
        return f"{median:.{places}f}"
    return f"{median:.{places}f} ({min(values):.{places}f}–{max(values):.{places}f})"


def main(path):
    runs = defaultdict(list)
    for line in open(path):
        report = json.loads(line)
        runs[report.get("run", report["scenario"])].append(report)
    for scenario, reports in runs.items():
        ok = [r for r in reports if not r.get("failed")]
        print(f"\n### {scenario} ({len(ok)} runs; median (min–max))\n")
        kind = ok[0]["scenario"] if ok else scenario
        columns = FLOOR_COLUMNS if kind == "http-floor" else COLUMNS + EXTRA.get(kind, [])
        print("| " + " | ".join(name for name, _, _ in columns) + " |")
        print("|" + "---|" * len(columns))
        print("| " + " | ".join(cell([figure(r, p) for r in ok], d) for _, p, d in columns) + " |")


if __name__ == "__main__":
    main(sys.argv[1])
