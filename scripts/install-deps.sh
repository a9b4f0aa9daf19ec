#!/usr/bin/env bash
# Installs the Debian packages tessera builds and tests with, if any is missing.
# Called by the Makefile before the first compile; safe to run by hand.
set -euo pipefail
pkgs=(gcc make pkg-config unzip
      libcjson-dev libyaml-dev libmicrohttpd-dev libpcre2-dev libutf8proc-dev libsystemd-dev)
# A python3 with venv support may come from elsewhere (pyenv); ask apt only if there is none.
if ! command -v python3 >/dev/null 2>&1 || ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
    pkgs+=(python3 python3-venv)
fi
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "install-deps: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
