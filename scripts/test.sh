#!/usr/bin/env bash
# Runs the whole test suite: formatting, lints, unit and integration tests, and the real-kernel
# tier (the pinned iac-code kernel is installed into a cached venv by scripts/kernel-venv.sh).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# Build outputs live in the cache outside the checkout, so a fresh clone reuses the compiled
# dependencies of the last run (an explicit CARGO_TARGET_DIR wins).
cache="${IAC_CODE_AGUI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/iac-code-agui}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$cache/target}"

echo "== fmt"
cargo fmt --all -- --check
echo "== clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== the book (docs/: mdBook, installed once into the cache; its links are checked by the tests)"
book=$(bash scripts/book.sh "$cache/book")
echo "   $book"
echo "== kernel venv"
IAC_CODE_AGUI_KERNEL_BIN=$(bash scripts/kernel-venv.sh)
export IAC_CODE_AGUI_KERNEL_BIN
echo "== conformance clients (@ag-ui/client 1.0.0, 0.0.59 and 0.0.58; puppeteer-core, esbuild)"
npm ci --prefix conformance --no-audit --no-fund --loglevel=error \
  --cache "$cache/npm"
echo "== the JavaScript client (clients/js: its own tests with @ag-ui/client 1.0.0 and 0.0.59, and its types)"
npm ci --prefix clients/js --no-audit --no-fund --loglevel=error \
  --cache "$cache/npm"
npm test --prefix clients/js
echo "== CopilotKit's runtime 1.75.0 (the client's end-to-end test with it; telemetry off in the test)"
npm ci --prefix clients/js/e2e/copilotkit --no-audit --no-fund --loglevel=error \
  --cache "$cache/npm"
echo "== the console (console/: its bundle checked against its sources; puppeteer-core for its browser test)"
npm ci --prefix console --no-audit --no-fund --loglevel=error --cache "$cache/npm"
node console/build.mjs --check
node --test console/test/
echo "== chromium, prometheus, postgresql, systemd, binutils, mmdebstrap and umoci (the real-browser, operability,"
echo "   several-instances and packaging tiers; Debian's packages: puppeteer-core downloads no"
echo "   browser; prometheus brings promtool)"
missing=()
[ -x /usr/bin/chromium ] || missing+=(chromium)
[ -x /usr/bin/prometheus ] && [ -x /usr/bin/promtool ] || missing+=(prometheus)
compgen -G "/usr/lib/postgresql/*/bin/initdb" > /dev/null || missing+=(postgresql)
# The packaging tier: the unit's verification, and the wheel's binary read for its glibc needs.
command -v systemd-analyze > /dev/null || missing+=(systemd)
command -v objdump > /dev/null || missing+=(binutils)
# The images: built offline from Debian's packages (mmdebstrap, umoci).
command -v mmdebstrap > /dev/null || missing+=(mmdebstrap)
command -v umoci > /dev/null || missing+=(umoci)
if [ ${#missing[@]} -gt 0 ]; then
  as_root=()
  [ "$(id -u)" -eq 0 ] || as_root=(sudo)
  apt_install() {
    # The tests start a Prometheus and PostgreSQL clusters of their own (free ports, temporary
    # directories).
    "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive \
      apt-get install -y -q --no-install-recommends "${missing[@]}"
  }
  # A stale package list names versions the mirror no longer has: refresh it and retry once.
  apt_install || { "${as_root[@]}" apt-get update -q && apt_install; }
fi
echo "== a kernel venv other users can run (the isolation tier: as root, users' kernels run as nobody,"
echo "   who cannot enter root's home; the venv is made from the system's Python under /var/cache)"
if [ "$(id -u)" -eq 0 ]; then
  shared=/var/cache/iac-code-agui
  install -d -m 755 "$shared"
  /usr/bin/python3 -m venv --help > /dev/null 2>&1 || {
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends python3-venv ||
      { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends python3-venv; }
  }
  IAC_CODE_AGUI_KERNEL_BIN_SHARED=$(IAC_CODE_AGUI_CACHE=$shared PYTHON=/usr/bin/python3 bash scripts/kernel-venv.sh)
  chmod -R a+rX "$shared/kernel-venv"
else
  # Kernels run as the gateway's own user, who runs the one in the cache.
  IAC_CODE_AGUI_KERNEL_BIN_SHARED=$IAC_CODE_AGUI_KERNEL_BIN
fi
export IAC_CODE_AGUI_KERNEL_BIN_SHARED
echo "== the wheel (packaging/python; built once a run, installed by its test into a fresh venv)"
IAC_CODE_AGUI_WHEEL=$(bash scripts/wheel.sh)
export IAC_CODE_AGUI_WHEEL
echo "== the images (scripts/image.sh: Debian bookworm with the wheel and its kernel, and the gateway"
echo "   alone; built once a run from Debian's packages)"
IAC_CODE_AGUI_IMAGE=$(bash scripts/image.sh "$IAC_CODE_AGUI_WHEEL")
export IAC_CODE_AGUI_IMAGE
echo "== tests"
profile=default
[ "${CI:-}" = "true" ] && profile=ci
cargo nextest run --workspace --locked --profile "$profile"
echo "== benchmark smoke (small sizes; no timing assertion)"
# The features the tests were built with: only the benchmark's binary is linked anew.
cargo build --locked --workspace --all-targets
bench="$CARGO_TARGET_DIR/debug/agui-bench"
gateway="$CARGO_TARGET_DIR/debug/iac-code-agui"
"$bench" --smoke --gateway "$gateway"
"$bench" --smoke --gateway "$gateway" --compare "" --rounds 1
"$bench" --smoke --gateway "$gateway" --threads
"$bench" --smoke --gateway "$gateway" --kernels
