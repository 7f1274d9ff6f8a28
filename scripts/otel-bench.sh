#!/usr/bin/env bash
# What tracing costs the hot path: Herald's CPU per message with tracing off, exporting 1 %
# of traces, and exporting all of them (and, given a second binary, a build from before
# tracing existed), alternated round by round so that the machine's drift hits them alike.
# Spans go to scripts/otlp-sink.py on port 4318 (answers 200, counts exports).
#
#   scripts/otel-bench.sh target/release/herald [OLD_HERALD] [ROUNDS=3] [RATE=3000]
#   BENCH_ARGS=--postgres scripts/otel-bench.sh …   (Herald on a throwaway PostgreSQL)
set -euo pipefail
new=${1:?the herald binary to measure}
old=${2:-}
rounds=${3:-3}
rate=${4:-3000}
bench=${BENCH:-$(dirname "$new")/herald-bench}
here=$(cd "$(dirname "$0")" && pwd)

python3 "$here/otlp-sink.py" 4318 &
sink=$!
trap 'kill $sink 2>/dev/null || true' EXIT
sleep 0.5

run() { # label binary [VAR=value …]
    local label=$1 binary=$2
    shift 2
    local report
    report=$(env "$@" "$bench" --scenario steady --spawn --herald "$binary" --rate "$rate" --duration 10 ${BENCH_ARGS:-} --json 2>/dev/null | tail -n 1)
    python3 - "$label" "$report" <<'PY'
import json, sys
label, report = sys.argv[1], json.loads(sys.argv[2])
lat = report.get("latencyMs", {})
print(f"{label:<12} cpu_us_per_msg={report['cpuMicrosPerMessage']:.1f} p50_ms={lat.get('p50')} "
      f"p99_ms={lat.get('p99')} missing={report.get('ledger', {}).get('missing')}", flush=True)
PY
}

collector=(OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318)
for round in $(seq "$rounds"); do
    echo "# round $round"
    [ -n "$old" ] && run before "$old"
    run off "$new"
    run "on 1 %" "$new" "${collector[@]}" OTEL_TRACES_SAMPLER=parentbased_traceidratio OTEL_TRACES_SAMPLER_ARG=0.01
    run "on 100 %" "$new" "${collector[@]}" OTEL_TRACES_SAMPLER=parentbased_always_on
done
