#!/usr/bin/env bash
# Runs the whole test suite: formatting, lints, unit and integration tests, and the real-kernel
# tier (the pinned iac-code kernel is installed into a cached venv by scripts/kernel-venv.sh).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

echo "== fmt"
cargo fmt --all -- --check
echo "== clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== kernel venv"
IAC_CODE_AGUI_KERNEL_BIN=$(bash scripts/kernel-venv.sh)
export IAC_CODE_AGUI_KERNEL_BIN
echo "== conformance clients (@ag-ui/client 1.0.0 and 0.0.58)"
npm ci --prefix conformance --no-audit --no-fund --loglevel=error \
  --cache "${IAC_CODE_AGUI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/iac-code-agui}/npm"
echo "== tests"
profile=default
[ "${CI:-}" = "true" ] && profile=ci
cargo nextest run --workspace --locked --profile "$profile"
echo "== benchmark smoke (small sizes; no timing assertion)"
cargo build --locked -p agui-bench -p iac-code-agui
./target/debug/agui-bench --smoke --gateway ./target/debug/iac-code-agui
