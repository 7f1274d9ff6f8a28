#!/usr/bin/env bash
# Runs the benchmark scenarios three times each against a Herald the bench spawns (SQLite in
# a temporary directory, or a throwaway PostgreSQL cluster for the "-pg" runs) and appends
# each run's JSON report to bench-results/<date>.jsonl (http-floor spawns nothing: it
# ignores --spawn). Summarise with scripts/bench-summary.py. Takes about 75 minutes on a 2-core
# machine; not part of the tests.
#   scripts/bench-all.sh [run ...]     (default: every run below)
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-${HERALD_CACHE_DIR:-$HOME/.cache/herald}/target}"
cargo build --release --quiet -p herald -p herald-bench
bench="$CARGO_TARGET_DIR/release/herald-bench"
mkdir -p bench-results
out="bench-results/$(date +%Y%m%d-%H%M%S).jsonl"

declare -A runs=(
    [http-floor]="--scenario http-floor --rate 10000 --duration 10"
    [ramp]="--scenario ramp --rate 3000 --duration 5"
    [steady]="--scenario steady --rate 3000 --duration 20"
    [fanout]="--scenario fanout --rate 600 --duration 15"
    [burst]="--scenario burst --rate 400 --duration 15 --burst-seconds 60"
    [noisy-neighbour]="--scenario noisy-neighbour --rate 2000 --duration 15"
    [slow-endpoints]="--scenario slow-endpoints --rate 3000 --duration 15"
    [backlog]="--scenario backlog --rate 6000 --messages 1000000 --drain-stall 60"
    [ramp-pg]="--scenario ramp --postgres --rate 1500 --duration 5"
    [steady-pg]="--scenario steady --postgres --rate 2500 --duration 20"
    [outbox-pg]="--scenario outbox --postgres --rate 1500 --duration 20"
    [scripts-noisy]="--scenario scripts-noisy --rate 500 --duration 15"
    [long-polls]="--scenario long-polls --rate 2000 --duration 15"
    [long-polls-pg]="--scenario long-polls --postgres --rate 2000 --duration 15"
    [endpoint-churn]="--scenario endpoint-churn --messages 10000"
    [endpoint-neighbour]="--scenario endpoint-neighbour --rate 2000 --duration 15"
)
order=(http-floor ramp steady fanout burst noisy-neighbour slow-endpoints backlog ramp-pg steady-pg outbox-pg
    scripts-noisy long-polls long-polls-pg endpoint-churn endpoint-neighbour)
selected=("$@")
[ ${#selected[@]} -gt 0 ] || selected=("${order[@]}")
for name in "${selected[@]}"; do
    for run in 1 2 3; do
        echo "==> $name, run $run: herald-bench --spawn ${runs[$name]} --json"
        # shellcheck disable=SC2086
        if report=$("$bench" --spawn ${runs[$name]} --json 2>/dev/null | tail -n 1); then
            echo "$report" | python3 -c "import json,sys; r=json.load(sys.stdin); r['run']='$name'; print(json.dumps(r))" >> "$out"
        else
            echo "{\"run\":\"$name\",\"scenario\":\"$name\",\"failed\":true}" >> "$out"
        fi
    done
done
echo "results: $out"
