#!/usr/bin/env bash
# Builds the gateway's wheel (packaging/python: maturin, `bindings = "bin"`) once for the current
# sources and prints its path. Linked by zig (the `ziglang` package) against glibc 2.17, so that
# its manylinux_2_17 tag is true. maturin and zig live in a cached venv outside the checkout,
# and the build reuses the cached target directory; each run's wheel goes to a directory of its
# own (another run sharing the cache never sees it half made; those over two hours old go):
#   ${IAC_CODE_AGUI_CACHE:-~/.cache/iac-code-agui}/{packaging-venv,target,wheels/run.*}
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

CACHE=${IAC_CODE_AGUI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/iac-code-agui}
TOOLS="$CACHE/packaging-venv"
STAMP="$TOOLS/.ready-maturin-1.16.0-ziglang-0.15.2"
PYTHON=${PYTHON:-python3}
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$CACHE/target}"

mkdir -p "$CACHE"
exec 9>"$CACHE/packaging-venv.lock"
flock 9
if [ ! -f "$STAMP" ] || ! "$TOOLS/bin/maturin" --version > /dev/null 2>&1; then
  rm -rf "$TOOLS"
  echo "wheel: installing maturin and zig into $TOOLS (once)" >&2
  "$PYTHON" -m venv "$TOOLS"
  "$TOOLS/bin/pip" install --quiet --no-input --disable-pip-version-check \
    'maturin==1.16.0' 'ziglang==0.15.2' >&2
  touch "$STAMP"
fi
# maturin finds zig as `python -m ziglang` of the python on PATH.
export PATH="$TOOLS/bin:$PATH"
mkdir -p "$CACHE/wheels"
find "$CACHE/wheels" -mindepth 1 -maxdepth 1 -mmin +120 -exec rm -rf {} +
out=$(mktemp -d "$CACHE/wheels/run.XXXXXX")
flock -u 9
(cd packaging/python &&
  maturin build --release --locked --zig --compatibility manylinux_2_17 --out "$out" >&2)
wheel=$(ls "$out"/iac_code_agui-*.whl)
[ "$(echo "$wheel" | wc -l)" -eq 1 ] || { echo "wheel: expected one wheel in $out" >&2; exit 1; }
echo "$wheel"
