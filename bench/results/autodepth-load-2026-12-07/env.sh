# Shared defaults of warm-ab.sh and fresh-ab.sh (sourced; ROUNDS and PORT are theirs).
BIN=${BIN:-build/tandem}
TAG=${TAG:-new}
OUTDIR=${OUTDIR:-build/load-ab}
PY=${PY:-build/venv-py/bin/python}
mkdir -p $OUTDIR
