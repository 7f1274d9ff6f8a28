#!/usr/bin/env bash
# Runs every benchmark scenario three times against a Herald the bench spawns (SQLite in a
# temporary directory) and appends each run's JSON report to bench-results/<date>.jsonl.
# Takes about 35 minutes on a 2-core machine; not part of the test suite.
#   scripts/bench-all.sh [scenario ...]     (default: all scenarios)
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-${HERALD_CACHE_DIR:-$HOME/.cache/herald}/target}"
cargo build --release --quiet
herald="$CARGO_TARGET_DIR/release/herald"
mkdir -p bench-results
out="bench-results/$(date +%Y%m%d-%H%M%S).jsonl"

declare -A args=(
    [ramp]="--rate 3000 --duration 5"
    [steady]="--rate 3000 --duration 20"
    [fanout]="--rate 600 --duration 15"
    [burst]="--rate 400 --duration 15 --burst-seconds 60"
    [noisy-neighbour]="--rate 2000 --duration 15"
    [slow-endpoints]="--rate 3000 --duration 15"
    [backlog]="--rate 6000 --messages 1000000 --drain-stall 60"
)
scenarios=("$@")
[ ${#scenarios[@]} -gt 0 ] || scenarios=(ramp steady fanout burst noisy-neighbour slow-endpoints backlog)
for scenario in "${scenarios[@]}"; do
    for run in 1 2 3; do
        echo "==> $scenario, run $run: herald bench --scenario $scenario --spawn ${args[$scenario]} --json"
        # shellcheck disable=SC2086
        "$herald" bench --scenario "$scenario" --spawn ${args[$scenario]} --json 2>/dev/null | tail -n 1 >> "$out" \
            || echo "{\"scenario\":\"$scenario\",\"failed\":true}" >> "$out"
    done
done
echo "results: $out"
