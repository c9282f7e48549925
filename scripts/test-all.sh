#!/usr/bin/env bash
# Installs everything the test suite needs on a fresh Debian or Ubuntu machine (apt packages included),
# then runs the linters, the type checker and the whole suite; arguments go to pytest. .ci/run calls this
# script. Python packages go into the checkout's own virtual environment (.venv: scripts/venv.sh), never
# into the system's Python, which Debian and Ubuntu keep to apt (PEP 668); its bin/ comes first on PATH, so
# the tests' subprocesses (sys.executable, python3, smlens) run from it too.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh
smlens_venv
python=$VENV/bin/python

APT_PACKAGES=(prometheus prometheus-alertmanager chromium curl ca-certificates)
APT_PACKAGES+=(libatomic1)  # Playwright's driver (Node.js) needs it; a minimal Debian or Ubuntu lacks it
# tests/test_image.py builds and runs the image; it debootstraps Debian 12, whose keyring Ubuntu lacks.
APT_PACKAGES+=(buildah podman runc debootstrap debian-archive-keyring)
missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  apt_update
  candidate=$(apt-cache policy chromium 2>/dev/null | sed -n 's/^ *Candidate: //p')
  if [[ " ${missing[*]} " == *" chromium "* && ( -z "$candidate" || "$candidate" == "(none)" ) ]]; then
    # Ubuntu packages Chromium only as a snap; the browser tests drive a system Chromium, never a
    # downloaded one.
    echo "warning: no chromium package here (Ubuntu: sudo snap install chromium); without a chromium" \
      "on PATH the browser tests skip, and fail under CI=true" >&2
    for i in "${!missing[@]}"; do [ "${missing[i]}" != chromium ] || unset 'missing[i]'; done
  fi
  if ((${#missing[@]})); then apt_install "${missing[@]}"; fi
fi
# Debian's packages ship systemd units; nothing here relies on them, tests start their own processes.

"$python" -m pip install -q --disable-pip-version-check -e '.[test]'
# NVIDIA's DCGM Python bindings for the conformance tests: never vendored, and not on any package
# registry, so they are used when a developer fetched them (scripts/fetch-dcgm-bindings.sh) or a DCGM is
# installed; otherwise those tests skip with a [DCGM] reason, the one skip besides [GPU] allowed in CI.
if [ -z "${SMLENS_DCGM_BINDINGS:-}" ] && cached=$(bash scripts/fetch-dcgm-bindings.sh --cached 2>/dev/null); then
  SMLENS_DCGM_BINDINGS="$cached"
  export SMLENS_DCGM_BINDINGS
fi

# One command a line: under set -e, a failure on the left of && would not stop the script.
echo "== ruff"
"$python" -m ruff check exporter tests bench tools
"$python" -m ruff format --check exporter tests bench tools
echo "== mypy"; "$python" -m mypy
echo "== pytest"; "$python" -m pytest -q -p no:cacheprovider "$@"
