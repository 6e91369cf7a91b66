#!/bin/sh
# Installs the Debian packages tandem builds and tests with, only when missing.
set -e
PKGS="build-essential libjansson-dev libpcre2-dev libutf8proc-dev libxxhash-dev libmicrohttpd-dev python3 python3-venv"
missing=""
for p in $PKGS; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing
fi
