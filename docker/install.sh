#!/bin/sh
# The image's only install step, also run by tests/test_docker.py in a clean virtual environment:
# smlens and its pinned runtime dependencies, from wheels only (no compiler anywhere), into a new venv.
# Usage: install.sh SOURCE_DIR VENV_DIR [EXTRAS]   (EXTRAS: e.g. "profile" for smlens profile's cupti-python)
set -eu
src=$1
venv=$2
extras=${3:-}
python3 -m venv "$venv"
"$venv/bin/pip" install --no-cache-dir --disable-pip-version-check --only-binary=:all: \
    --constraint "$src/docker/constraints.txt" "$src${extras:+[$extras]}"
# The exporter never installs anything at run time.
"$venv/bin/pip" uninstall --yes --quiet pip
