#!/usr/bin/env bash
# Downloads (does not install) the Debian packages build/tessera links, with their -dev
# packages, into DEST (default .debs/, ignored by git), for a GPU machine that has no
# package registry: scripts/gpu-check.sh unpacks them into a private prefix there.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${1:-.debs}
mkdir -p "$dest"
pkgs=(libmicrohttpd12 libmicrohttpd-dev libcjson1 libcjson-dev libyaml-0-2 libyaml-dev
      libpcre2-8-0 libpcre2-dev libpcre2-16-0 libpcre2-32-0 libpcre2-posix3
      libutf8proc2 libutf8proc-dev libgnutls30 libnettle8 libhogweed6 libp11-kit0 libtasn1-6
      libidn2-0 libunistring2 libgmp10 libffi8 libsystemd0 libsystemd-dev)
cd "$dest"
apt-get download "${pkgs[@]}"
ls -1 *.deb | wc -l
