#!/usr/bin/env bash
# The long fault-injection run: 20,000 messages × 3 endpoints under 300 s of seeded faults,
# five seeds (or HERALD_FAULT_SEEDS=1,2,3), on SQLite and on PostgreSQL. About an hour on a
# 2-core machine. Reports (lost, unexpected, duplicates, drain time, faults) are written to
# test-artifacts/faults-<backend>-<seed>.json.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-${HERALD_CACHE_DIR:-$HOME/.cache/herald}/target}"
export HERALD_TEST_ARTIFACTS="${HERALD_TEST_ARTIFACTS:-$PWD/test-artifacts}"
if [ "$(id -u)" = 0 ] && ! id postgres >/dev/null 2>&1; then
    useradd --system --no-create-home postgres
fi
cargo nextest run -p herald --test it --run-ignored only --no-capture faults::long_fault_run
