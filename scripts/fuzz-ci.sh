#!/usr/bin/env bash
# A short, time-boxed fuzz pass for CI: the `expression_check` target (tenant jq
# expressions: the bounds check, then compile on the sandbox worker's 64 MiB stack) for
# FUZZ_SECONDS (default 60), starting from fuzz/seeds/expression_check. Exits non-zero on
# a finding; the input is then in fuzz/artifacts/expression_check/ (crash-… or timeout-…).
#
# Stable Rust is enough: the target is built with the coverage instrumentation cargo-fuzz
# asks rustc for, minus AddressSanitizer (nightly-only; it finds memory errors in unsafe
# code, and the properties here are panics and stack overflows, which need no sanitizer),
# and libFuzzer comes from libfuzzer-sys, built from source by its build script (a C++
# compiler is needed). `--target` keeps these flags off
# build scripts and proc macros, which are not linked with libFuzzer.
#
#   scripts/fuzz-ci.sh                       (60 s, a debug build: quick to build)
#   FUZZ_SECONDS=1800 FUZZ_RELEASE=1 scripts/fuzz-ci.sh
#                                            (a longer run, optimized: more executions)
#   FUZZ_CORPUS=dir scripts/fuzz-ci.sh       (keep the generated corpus; default: a
#                                             temporary directory, removed afterwards)
set -euo pipefail
cd "$(dirname "$0")/.."

target=expression_check
seconds="${FUZZ_SECONDS:-60}"
cache="${HERALD_CACHE_DIR:-$HOME/.cache/herald}"
# Its own target directory: these flags would otherwise rebuild the main build's artifacts.
export CARGO_TARGET_DIR="$cache/fuzz-target"
host=$(rustc -vV | sed -n 's/^host: //p')
cargo=(cargo)
if command -v rustup >/dev/null; then
    cargo=(cargo +stable)
fi

# The flags of `cargo fuzz build` (cargo-fuzz 0.12/0.13, release mode), without
# `-Zsanitizer=address`; `-Cdebug-assertions` as with `cargo fuzz build -a`.
flags=(
    -Cpasses=sancov-module
    -Cllvm-args=-sanitizer-coverage-level=4
    -Cllvm-args=-sanitizer-coverage-inline-8bit-counters
    -Cllvm-args=-sanitizer-coverage-pc-table
    -Cllvm-args=-sanitizer-coverage-trace-compares
    -Cllvm-args=-sanitizer-coverage-stack-depth
    -Cllvm-args=-simplifycfg-branch-fold-threshold=0
    --cfg fuzzing
    -Clink-dead-code
    -Cdebug-assertions
)
profile=debug
build=()
if [ -n "${FUZZ_RELEASE:-}" ]; then
    profile=release
    build=(--release)
    flags+=(-Ccodegen-units=1)
fi
RUSTFLAGS="${flags[*]}" "${cargo[@]}" build "${build[@]}" --manifest-path fuzz/Cargo.toml \
    --target "$host" --bin "$target"
binary="$CARGO_TARGET_DIR/$host/$profile/$target"

# Past findings first: each must pass again.
regressions=(fuzz/regressions/"$target"/*)
if [ -e "${regressions[0]}" ]; then
    "$binary" -rss_limit_mb=2048 -timeout=30 "${regressions[@]}"
fi

corpus="${FUZZ_CORPUS:-}"
if [ -z "$corpus" ]; then
    corpus=$(mktemp -d "${TMPDIR:-/tmp}/herald-fuzz-$target.XXXXXX")
    trap 'rm -rf "$corpus"' EXIT
fi
artifacts="fuzz/artifacts/$target"
mkdir -p "$corpus" "$artifacts"

# New inputs go to the first directory (the scratch corpus), never to the seeds. Inputs
# grow up to bounds::MAX_BYTES (libFuzzer's default would stop at 4 KiB). A unit that runs
# 30 s (15 times the sandbox's compile budget) is reported as a timeout rather than left
# to hold the time box.
status=0
"$binary" "$corpus" "fuzz/seeds/$target" \
    -max_total_time="$seconds" -rss_limit_mb=2048 -max_len=16384 -timeout=30 \
    -artifact_prefix="$artifacts/" -print_final_stats=1 || status=$?
if [ "$status" -ne 0 ]; then
    echo "fuzz-ci: $target found something (exit $status); the input is in $artifacts/" >&2
fi
exit "$status"
