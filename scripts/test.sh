#!/usr/bin/env bash
# Runs Herald's whole test suite: unit tests (the store conformance suite on SQLite and on
# PostgreSQL), integration tests against real servers, receivers and databases, the crash
# tests, the Svix SDK compatibility tests (Python, and the JavaScript kitchen sink), and then
# the HTTP integration suite once more with PostgreSQL as the store.
#
# It prepares what the tests need: a Python virtual environment with the pinned SDK
# packages (tests/sdk/requirements.txt) and the pinned Svix npm package
# (tests/sdk/js/package-lock.json), kept in ~/.cache/herald so later runs reuse them.
# PostgreSQL clusters are started by the tests themselves (initdb + postgres from the server
# binaries on this machine, on free ports, in temporary directories). The dashboard tests
# drive a headless Chromium: the Debian packages chromium and chromium-driver are installed
# when missing; every page is checked with the pinned axe-core (tests/browser/package.json);
# screenshots land in test-artifacts/. The event destination tests start their own brokers
# from the Debian packages (installed when missing).
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

# Installs the pinned npm packages of $1 (package.json + package-lock.json) into $2, once.
npm_install() {
    if ! cmp -s "$1/package-lock.json" "$2/package-lock.json" 2>/dev/null; then
        command -v npm >/dev/null 2>&1 || { echo "node and npm are needed for $3" >&2; exit 1; }
        echo "==> installing $3 ($2)"
        rm -rf "$2"
        mkdir -p "$2"
        cp "$1/package.json" "$1/package-lock.json" "$2/"
        (cd "$2" && npm ci --silent --no-audit --no-fund)
    fi
}
npm_install crates/herald/tests/sdk/js "$cache/node-sdk" "the Svix JavaScript SDK for the kitchen-sink test"
export HERALD_TEST_NODE_MODULES="$cache/node-sdk/node_modules"
npm_install crates/herald/tests/browser "$cache/node-browser" "axe-core for the dashboard's accessibility checks"
export HERALD_TEST_AXE="$cache/node-browser/node_modules/axe-core/axe.min.js"

if ! command -v chromedriver >/dev/null 2>&1 || ! command -v chromium >/dev/null 2>&1; then
    echo "==> installing chromium and chromium-driver (Debian packages) for the dashboard tests"
    sudo=""
    [ "$(id -u)" = 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium chromium-driver >/dev/null
fi
export HERALD_TEST_ARTIFACTS="${HERALD_TEST_ARTIFACTS:-$PWD/test-artifacts}"

# The event destination tests start their own brokers (on free loopback ports, data in
# temporary directories, killed and restarted mid-run): the Debian packages are installed
# when missing. The Amazon types run against moto (pip, in the Python environment above),
# reached through socat, which the tests kill to make the service unreachable; Kafka runs
# against tansu (below) and is read back with confluent-kafka (pip).
missing=()
for broker in redis-server nats-server rabbitmq-server socat; do
    if ! command -v "$broker" >/dev/null 2>&1 && [ ! -x "/usr/bin/$broker" ] && [ ! -x "/usr/sbin/$broker" ]; then
        missing+=("$broker")
    fi
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "==> installing ${missing[*]} (Debian packages) for the event destination tests"
    sudo=""
    [ "$(id -u)" = 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
    # A package may start a system-wide server; the tests start their own.
    for broker in "${missing[@]}"; do
        ($sudo service "$broker" stop || true) >/dev/null 2>&1
    done
fi

# Kafka: tansu, a Kafka-protocol broker from the Rust registry, with its SQLite storage
# engine (so a broker killed mid-run keeps what it acknowledged), built once (about 15
# minutes on 2 cores) and kept in the cache.
tansu_root="$cache/tansu-libsql"
if [ ! -x "$tansu_root/bin/tansu" ]; then
    echo "==> building tansu 0.6.0 (a Kafka-protocol broker) for the Kafka destination tests ($tansu_root)"
    cargo install --quiet tansu --version 0.6.0 --features libsql --root "$tansu_root" --target-dir "$cache/tansu-target"
fi
export PATH="$tansu_root/bin:$PATH"

# PostgreSQL refuses to run as root; as root the tests run it as the `postgres` user.
if [ "$(id -u)" = 0 ] && ! id postgres >/dev/null 2>&1; then
    useradd --system --no-create-home postgres
fi

if cargo nextest --version >/dev/null 2>&1; then
    cargo nextest run --workspace --no-fail-fast "$@"
    # The Amazon destinations' 10,000-message runs are bound by the emulator, not the
    # store (the other destination types' runs cover PostgreSQL): SQLite only.
    echo "==> the HTTP integration suite again, on PostgreSQL"
    HERALD_TEST_BACKEND=postgres cargo nextest run --workspace --no-fail-fast --test it \
        -E 'not test(/^postgres::/) and not test(/^bench::/) and not test(/^faults::/) and not test(/^destinations::amazon::.*ten_thousand/)' "$@"
else
    cargo test --workspace --no-fail-fast "$@"
    echo "==> the HTTP integration suite again, on PostgreSQL"
    HERALD_TEST_BACKEND=postgres cargo test --workspace --no-fail-fast --test it -- \
        --skip postgres:: --skip bench:: --skip faults:: --skip ten_thousand_messages_arrive "$@"
fi
