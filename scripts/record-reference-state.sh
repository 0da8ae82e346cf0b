#!/usr/bin/env bash
# Records the thread-state fixtures of crates/gateway/tests/data/reference-state/ from the Python
# adapter this gateway replaces (`iac-code agui` of iac-code 0.16.0 with a2a-sdk 1.1.5) in front of
# the real kernel (`iac-code a2a`) and a scripted fake LLM, offline on 127.0.0.1:
#
#   scripts/record-reference-state.sh [OUT_DIR] [--requests FILE] [--only S03,S10] [--keep-work]
#
# OUT_DIR defaults to the fixture directory itself (its fixture files are replaced: that is how
# they are refreshed after the pinned iac-code changes). The kernel venv comes from
# $IAC_CODE_AGUI_KERNEL_BIN or scripts/kernel-venv.sh. The scenarios and options are described in
# scripts/record-reference-state.py; the integration test `fixtures::` runs this script and holds
# its output to the committed files.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=$root/crates/gateway/tests/data/reference-state
if [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; then
  out=$1
  shift
fi
bin=${IAC_CODE_AGUI_KERNEL_BIN:-}
[ -n "$bin" ] || bin=$(bash "$root/scripts/kernel-venv.sh")
exec "$bin/python" "$root/scripts/record-reference-state.py" --bin "$bin" --out "$out" "$@"
