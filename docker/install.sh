#!/bin/sh
# The image's only install step, also run by tests/test_docker.py in a clean virtual environment:
# smlens and its pinned runtime dependencies, from wheels only (no compiler anywhere), into a new venv.
# The venv never gets pip (nor, on Python < 3.12, setuptools): the base's own pip installs into it through
# --python (pip >= 22.3), so nothing that installs packages reaches the image.
# Usage: install.sh SOURCE_DIR VENV_DIR [EXTRAS]   (EXTRAS: e.g. "profile" for smlens profile's cupti-python)
set -eu
src=$1
venv=$2
extras=${3:-}
python3 -m venv --without-pip "$venv"
python3 -m pip --python "$venv/bin/python" install --no-cache-dir --disable-pip-version-check \
    --root-user-action=ignore --only-binary=:all: --constraint "$src/docker/constraints.txt" \
    "$src${extras:+[$extras]}"
