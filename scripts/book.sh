#!/usr/bin/env bash
# Builds the book (docs/) with a pinned mdBook, installed once into the cache outside the clone
# (~/.cache/iac-code-agui/mdbook; IAC_CODE_AGUI_CACHE moves it). Prints the built index's path.
#   scripts/book.sh [DEST]     DEST: the output directory (default docs/book, gitignored)
# Its links and anchors are checked by the docs:: tests (crates/gateway/tests/it/docs.rs).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
cache="${IAC_CODE_AGUI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/iac-code-agui}"
version=0.4.52
mdbook="$cache/mdbook/bin/mdbook"
if [ "$("$mdbook" --version 2>/dev/null)" != "mdbook v$version" ]; then
  # Without the server and the file watcher (`mdbook build` needs neither), built in cargo's own
  # temporary directory rather than the workspace's target (an exported CARGO_TARGET_DIR too).
  env -u CARGO_TARGET_DIR cargo install mdbook --locked --version "$version" \
    --no-default-features --features search --root "$cache/mdbook" >&2
fi
dest=$(realpath -m "${1:-docs/book}")
"$mdbook" build docs --dest-dir "$dest" >&2
echo "$dest/index.html"
