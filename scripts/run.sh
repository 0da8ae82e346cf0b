#!/usr/bin/env bash
# Builds the gateway (release), installs the pinned iac-code kernel into a cached venv, and runs
# `iac-code-agui` with the kernel on PATH. Every argument is passed to the gateway, e.g.
#   scripts/run.sh --port 8000 --state-dir ./state
# Configure the LLM with the usual IAC_CODE_* variables (IAC_CODE_PROVIDER, IAC_CODE_MODEL,
# IAC_CODE_BASE_URL, IAC_CODE_API_KEY) or per request (forwardedProps.iacCode.model/llmApiKey).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
cargo build --release --locked -p iac-code-agui >&2
KERNEL_BIN=$(bash scripts/kernel-venv.sh)
export PATH="$KERNEL_BIN:$PATH"
exec ./target/release/iac-code-agui "$@"
