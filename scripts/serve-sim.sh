#!/usr/bin/env bash
# The README's first command: the exporter on a simulated 8-GPU node (no GPU, NVML or DCGM needed), from the
# checkout's own virtual environment (.venv, made here: scripts/venv.sh), so that it works on Debian's and
# Ubuntu's own Python as on any other. Extra arguments go to `smlens serve`
# (e.g. --listen 127.0.0.1:10133 when 10132 is taken).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh
smlens_venv
"$VENV/bin/python" -m pip install -q --disable-pip-version-check -e .
exec "$VENV/bin/smlens" serve --backend sim "$@"
