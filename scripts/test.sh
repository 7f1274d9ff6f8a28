#!/usr/bin/env bash
# Runs Herald's whole test suite: unit tests, integration tests against real servers,
# receivers and SQLite, the crash test, and the Svix Python SDK compatibility test.
#
# It prepares what the tests need: a Python virtual environment with the pinned SDK
# packages (tests/sdk/requirements.txt), kept in ~/.cache/herald so later runs reuse it.
# Extra arguments go to the test runner (e.g. a test name filter).
set -euo pipefail
cd "$(dirname "$0")/.."

cache="${HERALD_CACHE_DIR:-$HOME/.cache/herald}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$cache/target}"

venv="$cache/venv"
requirements=crates/herald/tests/sdk/requirements.txt
stamp="$venv/.requirements"
if ! cmp -s "$requirements" "$stamp" 2>/dev/null; then
    echo "==> preparing the Python environment for the SDK test ($venv)"
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$requirements"
    cp "$requirements" "$stamp"
fi
export HERALD_TEST_PYTHON="$venv/bin/python"

if cargo nextest --version >/dev/null 2>&1; then
    cargo nextest run --workspace --no-fail-fast "$@"
else
    cargo test --workspace --no-fail-fast "$@"
fi
