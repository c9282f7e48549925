# Sourced (from the checkout's root) by scripts/serve-sim.sh and scripts/test-all.sh, never run alone.
# Debian's and Ubuntu's own Python refuses `pip install` outside a virtual environment (PEP 668), and its
# `python3 -m venv` needs the python3-venv package, so the scripts install into the checkout's own venv:
# smlens_venv makes .venv (or $SMLENS_VENV) with the system's python3 when it is missing or broken,
# apt-installing python3-venv first where that is what it lacks (python3 too where there is none), then puts
# the venv's bin/ first on PATH, so that `python3`, `pip` and `smlens` in the scripts and tests are the venv's.
# VENV names it afterwards. .gitignore keeps .venv out of git.

as_root() {  # as_root COMMAND...: as is when root, else through sudo
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

apt_update() {  # once per run of a script
  [ -n "${APT_UPDATED:-}" ] || as_root apt-get update -qq
  APT_UPDATED=1
}

apt_install() {  # apt_install PACKAGE...: no questions asked
  apt_update
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@"
}

smlens_venv() {
  VENV=${SMLENS_VENV:-$PWD/.venv}
  if ! "$VENV/bin/python" -m pip --version >/dev/null 2>&1; then
    if ! command -v python3 >/dev/null; then
      command -v apt-get >/dev/null || { echo "smlens: no python3 (3.10 or newer) on PATH" >&2; return 1; }
      apt_install python3 python3-venv
    fi
    # A venv left without pip (ensurepip was missing) or whose interpreter is gone is made again.
    [ ! -f "$VENV/pyvenv.cfg" ] || rm -rf "$VENV"
    if ! python3 -m venv "$VENV" >/dev/null 2>&1; then
      rm -rf "$VENV"
      if ! command -v apt-get >/dev/null; then
        python3 -m venv "$VENV"  # shows why; the set -e of the caller stops there
        return 1
      fi
      echo "smlens: python3 -m venv needs the python3-venv package; installing it" >&2
      apt_install python3-venv
      python3 -m venv "$VENV"
    fi
  fi
  export PATH="$VENV/bin:$PATH"
  hash -r
}
