#!/usr/bin/env bash
# Installs everything the test suite needs on a fresh Debian machine (apt packages included),
# then runs the linters, the type checker and the whole suite. .ci/run calls this script.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(prometheus prometheus-alertmanager chromium curl ca-certificates)
APT_PACKAGES+=(buildah podman runc debootstrap)  # tests/test_image.py builds and runs the image
missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# Debian's packages ship systemd units; nothing here relies on them, tests start their own processes.

python3 -m pip install -q --disable-pip-version-check -e '.[test]'
# NVIDIA's DCGM Python bindings for the conformance tests: never vendored, and not on any package
# registry, so they are used when a developer fetched them (scripts/fetch-dcgm-bindings.sh) or a DCGM is
# installed; otherwise those tests skip with a [DCGM] reason, the one skip besides [GPU] allowed in CI.
if [ -z "${SMLENS_DCGM_BINDINGS:-}" ] && cached=$(bash scripts/fetch-dcgm-bindings.sh --cached 2>/dev/null); then
  SMLENS_DCGM_BINDINGS="$cached"
  export SMLENS_DCGM_BINDINGS
fi

echo "== ruff"; python3 -m ruff check exporter tests bench tools && python3 -m ruff format --check exporter tests bench tools
echo "== mypy"; python3 -m mypy
echo "== pytest"; python3 -m pytest -q -p no:cacheprovider "$@"
