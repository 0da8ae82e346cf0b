#!/usr/bin/env bash
# Creates (or reuses) the Python venv that holds the pinned iac-code execution kernel:
#   iac-code==0.16.0 with a2a-sdk==1.1.5 (a2a-sdk 1.2+ breaks `iac-code a2a` at import).
# The venv lives outside the checkout so repeat runs are fast:
#   ${IAC_CODE_AGUI_CACHE:-~/.cache/iac-code-agui}/kernel-venv
# Prints the venv's bin directory on stdout when it is ready.
set -euo pipefail

CACHE=${IAC_CODE_AGUI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/iac-code-agui}
VENV="$CACHE/kernel-venv"
STAMP="$VENV/.ready-iac-code-0.16.0-a2a-sdk-1.1.5"
PYTHON=${PYTHON:-python3}

if [ -f "$STAMP" ] && [ -x "$VENV/bin/iac-code" ]; then
  echo "$VENV/bin"
  exit 0
fi

mkdir -p "$CACHE"
exec 9>"$CACHE/kernel-venv.lock"
flock 9
if [ -f "$STAMP" ] && [ -x "$VENV/bin/iac-code" ]; then
  echo "$VENV/bin"
  exit 0
fi
# No stamp: a previous install was interrupted or never ran. Start clean.
rm -rf "$VENV"
echo "kernel-venv: installing iac-code 0.16.0 into $VENV (a few minutes, once)" >&2
"$PYTHON" -m venv "$VENV"
"$VENV/bin/pip" install --quiet --no-input --disable-pip-version-check \
  'iac-code[a2a,agui]==0.16.0' 'a2a-sdk[http-server,signing]==1.1.5' >&2
"$VENV/bin/iac-code" a2a --help >/dev/null
touch "$STAMP"
echo "$VENV/bin"
