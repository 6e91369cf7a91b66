#!/bin/sh
# End-to-end tests of `tandem serve` with pytest and the official openai SDK.
# Usage: sh tests/py/run.sh BUILD_DIR   (BUILD_DIR holds the tandem binary)
# The virtual environment lives in BUILD_DIR/venv-py (outside git) and is
# reused while tests/py/requirements.txt is unchanged. Exits with pytest's code.
set -u
BUILD=${1:-build}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
case "$BUILD" in /*) ;; *) BUILD="$ROOT/$BUILD" ;; esac
VENV="$BUILD/venv-py"
REQ="$HERE/requirements.txt"
if [ ! -x "$VENV/bin/python" ] || ! cmp -s "$REQ" "$VENV/.requirements" 2>/dev/null; then
  python3 -m venv "$VENV" || { echo "run.sh: cannot create $VENV"; exit 2; }
  "$VENV/bin/pip" install -q --disable-pip-version-check -r "$REQ" || { echo "run.sh: pip install failed"; exit 2; }
  cp "$REQ" "$VENV/.requirements"
fi
if [ ! -x "$BUILD/tandem" ]; then echo "run.sh: $BUILD/tandem not built"; exit 2; fi
cd "$ROOT" && TANDEM_BIN="$BUILD/tandem" exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider "$HERE"
