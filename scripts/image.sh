#!/usr/bin/env bash
# Builds the gateway's container images from Debian's packages (no container registry is pulled)
# into one OCI layout, and prints the layout's path:
#   <layout>:full     Debian bookworm (minbase, without docs: "slim"), Python 3.11 and the wheel
#                     installed into /opt/iac-code-agui with the pinned kernel; tini as PID 1
#   <layout>:sidecar  the gateway alone (no Python), for --a2a-url deployments where the kernel
#                     runs in a container of its own
# Both run as the non-root user iac-code-agui (10001), keep their state in the volume
# /var/lib/iac-code-agui (its HOME), listen on 0.0.0.0:8000 (a token is then required) and
# expose 8000 and 9464 (--metrics-listen). Configuration: the gateway's variables.
#
# Usage: scripts/image.sh [WHEEL]   (default: the wheel scripts/wheel.sh builds)
# Needs root (mmdebstrap, umoci unpack), mmdebstrap and umoci (Debian's packages); fetches
# Debian's packages and the kernel's wheels (no container registry). Output: a layout of its own
# under ${IAC_CODE_AGUI_CACHE:-~/.cache/iac-code-agui}/image/ (layouts of runs over two hours old
# are removed), whose path alone goes to stdout.
set -euo pipefail
exec 3>&1 1>&2
[ $# -eq 0 ] || set -- "$(realpath "$1")"
cd "$(dirname "${BASH_SOURCE[0]}")/.."

CACHE=${IAC_CODE_AGUI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/iac-code-agui}
wheel=${1:-$(bash scripts/wheel.sh)}
version=$(basename "$wheel" | cut -d- -f2)
mkdir -p "$CACHE/image"
find "$CACHE/image" -mindepth 1 -maxdepth 1 -mmin +120 -exec rm -rf {} +
# A run's own layout: another run sharing the cache never sees it half made.
out=$(mktemp -d "$CACHE/image/run.XXXXXX")
oci="$out/oci"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The kernel and everything it needs, as wheels, fetched here (this machine's index settings and
# certificates stay here) and installed in the image without a network, by the packaging venv's
# pip (scripts/wheel.sh makes it), whose Python must be the image's: Debian bookworm's 3.11.
pip="$CACHE/packaging-venv/bin/pip"
"$CACHE/packaging-venv/bin/python" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' || {
  echo "image: the packaging venv's Python must be 3.11, as Debian bookworm's"
  exit 1
}
mkdir -p "$work/wheels"
"$pip" wheel --quiet --no-input --disable-pip-version-check --wheel-dir "$work/wheels" "$wheel"
# The installer, run from its wheel: the image's environment gets no pip or setuptools of its own
# (Debian's venv would seed old ones, with known vulnerabilities; nothing at run time needs them).
mkdir -p "$work/installer"
"$pip" download --quiet --no-input --disable-pip-version-check --no-deps --only-binary=:all: \
  --dest "$work/installer" 'pip==26.3'

# The image's own user, written directly (no useradd: the sidecar image has no passwd package).
user_hook='printf "%s\n" "iac-code-agui:x:10001:10001:iac-code-agui gateway:/var/lib/iac-code-agui:/usr/sbin/nologin" >> "$1/etc/passwd" && printf "%s\n" "iac-code-agui:x:10001:" >> "$1/etc/group" && { [ ! -f "$1/etc/shadow" ] || printf "%s\n" "iac-code-agui:!*:1::::::" >> "$1/etc/shadow"; } && { [ ! -f "$1/etc/gshadow" ] || printf "%s\n" "iac-code-agui:!::" >> "$1/etc/gshadow"; } && mkdir -p "$1/var/lib/iac-code-agui" && chown 10001:10001 "$1/var/lib/iac-code-agui" && chmod 0700 "$1/var/lib/iac-code-agui"'
# Docs, manuals and locales left out, as Debian's slim images do.
slim=(--dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*'
      --dpkgopt='path-include=/usr/share/doc/*/copyright' --dpkgopt='path-exclude=/usr/share/locale/*'
      --dpkgopt='path-exclude=/usr/share/info/*')
# Nothing of the build host stays: its resolver and host name (mmdebstrap copies them in).
clean_hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/* "$1"/tmp/* "$1"/root/.cache "$1"/etc/resolv.conf "$1"/etc/hostname'

echo "image: the full image's root file system (Debian bookworm, python3, tini)"
mmdebstrap --quiet --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr --variant=minbase "${slim[@]}" \
  --include=python3,python3-venv,tini,ca-certificates \
  --customize-hook="$user_hook" \
  --customize-hook="copy-in '$work/wheels' '$work/installer' /tmp" \
  --customize-hook='chroot "$1" python3 -m venv --without-pip /opt/iac-code-agui' \
  --customize-hook='chroot "$1" sh -c "set -- /tmp/installer/pip-*.whl && env -i PATH=/usr/bin:/bin HOME=/root /opt/iac-code-agui/bin/python \"\$1/pip\" install --quiet --no-index --no-cache-dir --disable-pip-version-check --find-links /tmp/wheels iac-code-agui"' \
  --customize-hook="$clean_hook" \
  bookworm "$work/full.tar"

echo "image: the sidecar image's root file system (the gateway alone)"
mkdir -p "$work/bin"
python3 - "$wheel" "$work/bin/iac-code-agui" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    name = next(n for n in z.namelist() if n.endswith(".data/scripts/iac-code-agui"))
    open(sys.argv[2], "wb").write(z.read(name))
PY
chmod 0755 "$work/bin/iac-code-agui"
mmdebstrap --quiet --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr --variant=essential "${slim[@]}" \
  --include=tini,ca-certificates \
  --customize-hook="$user_hook" \
  --customize-hook="copy-in '$work/bin/iac-code-agui' /usr/local/bin" \
  --customize-hook="$clean_hook" \
  bookworm "$work/sidecar.tar"

revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
umoci init --layout "$oci"
image() { # tag rootfs.tar entrypoint description
  local tag=$1 tar=$2 entry=$3 desc=$4
  umoci new --image "$oci:$tag"
  umoci unpack --image "$oci:$tag" "$work/bundle-$tag"
  tar -C "$work/bundle-$tag/rootfs" -xf "$tar"
  umoci repack --image "$oci:$tag" "$work/bundle-$tag"
  umoci config --image "$oci:$tag" \
    --config.entrypoint /usr/bin/tini --config.entrypoint -- --config.entrypoint "$entry" \
    --config.user 10001:10001 \
    --config.workingdir /var/lib/iac-code-agui \
    --config.env PATH=/opt/iac-code-agui/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --config.env HOME=/var/lib/iac-code-agui \
    --config.env IAC_CODE_AGUI_HOST=0.0.0.0 \
    --config.env IAC_CODE_AGUI_PORT=8000 \
    --config.exposedports 8000/tcp --config.exposedports 9464/tcp \
    --config.volume /var/lib/iac-code-agui \
    --config.stopsignal SIGTERM \
    --config.label org.opencontainers.image.title=iac-code-agui \
    --config.label "org.opencontainers.image.description=$desc" \
    --config.label "org.opencontainers.image.version=$version" \
    --config.label org.opencontainers.image.licenses=Apache-2.0 \
    --config.label "org.opencontainers.image.revision=$revision" \
    --history.created_by "scripts/image.sh ($tag)"
}
image full "$work/full.tar" /opt/iac-code-agui/bin/iac-code-agui \
  "AG-UI gateway with the pinned iac-code execution kernel (iac-code 0.16.0, a2a-sdk 1.1.5)"
image sidecar "$work/sidecar.tar" /usr/local/bin/iac-code-agui \
  "AG-UI gateway alone, for a kernel in another container (--a2a-url)"
umoci gc --layout "$oci"
echo "$oci" >&3
