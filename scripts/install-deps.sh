#!/bin/sh
# Installs the Debian packages tandem builds and tests with, only when missing.
set -e
PKGS="build-essential libjansson-dev libpcre2-dev libutf8proc-dev libxxhash-dev libmicrohttpd-dev python3 python3-venv"
# make fuzz (tests/fuzz): clang, and libclang_rt.fuzzer / asan / ubsan (libclang-rt-dev; clang does not pull it in)
PKGS="$PKGS clang libclang-rt-dev"
missing=""
for p in $PKGS; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing
fi
