#!/usr/bin/env bash
# Fetches NVIDIA's DCGM Python bindings (four files of NVIDIA/DCGM testing/python3, Apache-2.0) for
# the DCGM conformance tests, checks them against pinned SHA-256 sums and prints the directories as
# a value for SMLENS_DCGM_BINDINGS. They land in a cache outside the repository: smlens never ships
# or copies NVIDIA's code. With --from-git DIR they come from a local clone of NVIDIA/DCGM instead;
# with --cached it only checks the cache and exits 1, downloading nothing, when a file is missing.
#   export SMLENS_DCGM_BINDINGS="$(bash scripts/fetch-dcgm-bindings.sh)"
set -euo pipefail

cache="${SMLENS_DCGM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/smlens/dcgm-bindings}"
clone=""
cached_only=""
case "${1:-}" in
  --from-git) clone="$2" ;;
  --cached) cached_only=1 ;;
esac

# tag file sha256 (git blob contents at the tag, as raw.githubusercontent.com serves them)
PINS="
v3.1.8 dcgm_agent.py cb7926c3a0d7e18612456226da7536c1fa8f26c54c2c0cb659bcc872811aa8e3
v3.1.8 dcgm_fields.py aa008efe1b2e21b37482acfa2f60f6378f6eda716f543bf8468ce6f25fa04527
v3.1.8 dcgm_structs.py 0de29fe0f4838c943ac329fca99222b79b621f21f4444c0b1de468a99833b066
v3.1.8 dcgmvalue.py aedb611b50b50ed1eb2facfadea0f1fa9e01f2cabb36a62a67355a71ba605ab9
v3.3.9 dcgm_agent.py 5304ca67084591a1a602ba23deb44e42c987e5144fa3797327a22a4cebfa2128
v3.3.9 dcgm_fields.py c1016aa0b9f9a40beaf06992b21ffffba2bb0901e86b7adba613df9ecc943afa
v3.3.9 dcgm_structs.py 8b891168c6291b71a48be26df604cab39b9de6a0683bbe6f46a29f6079276bdf
v3.3.9 dcgmvalue.py e7d2f1fa1f8fa9505ae8ace17b1a1218b78d914971632653d384ae1b2fc9cf3e
v4.5.3 dcgm_agent.py 2f41ae0e96c37f3f42189fb7cb55f977d44e5903250ddc2b392a83e2f8fcedda
v4.5.3 dcgm_fields.py b86b26c64ec5c60765a62eb9711c1a8b69031d5e5f6fe12c95e76ff17f318910
v4.5.3 dcgm_structs.py 838291ba54f6c0d3ffede4fbdee9bb2c48a08a9b9bb965a65e321077be8b7f26
v4.5.3 dcgmvalue.py f45e74ab62e57d6d544d24a37c29043fb6f5154095fb5dd006481112e405677e
v4.6.0 dcgm_agent.py a74e669c9406bc849a157d34a0018f567f577184cbf1064b80986836212ef38e
v4.6.0 dcgm_fields.py d074a5fe5f8b92768c6e028c1e9a7012ec9f81485869c8b020bcef095daf7bdf
v4.6.0 dcgm_structs.py f8d2a190b8686533b8f8ac6b38db23982bb70a727fe624d546849b4a0055f1ca
v4.6.0 dcgmvalue.py 408722715cc5637d06c2701eecf0a13924ebaa0b6fb6bdd168a0dbdddbd6330f
"

dirs=()
while read -r tag file sum; do
  [ -n "$tag" ] || continue
  dir="$cache/$tag"
  mkdir -p "$dir"
  target="$dir/$file"
  if ! echo "$sum  $target" | sha256sum --check --status 2>/dev/null; then
    if [ -n "$cached_only" ]; then
      echo "NVIDIA/DCGM $tag testing/python3/$file is not in $cache." >&2
      exit 1
    elif [ -n "$clone" ]; then
      git -C "$clone" show "$tag:testing/python3/$file" >"$target.part"
    else
      url="https://raw.githubusercontent.com/NVIDIA/DCGM/$tag/testing/python3/$file"
      if ! curl -fsSL --retry 3 -o "$target.part" "$url"; then
        echo "cannot download $url (no network? pass --from-git with a clone of NVIDIA/DCGM)." >&2
        exit 1
      fi
    fi
    if ! echo "$sum  $target.part" | sha256sum --check --status; then
      echo "NVIDIA/DCGM $tag testing/python3/$file does not match its pinned SHA-256." >&2
      exit 1
    fi
    mv "$target.part" "$target"
  fi
  case " ${dirs[*]:-} " in *" $dir "*) ;; *) dirs+=("$dir") ;; esac
done <<<"$PINS"
(IFS=:; echo "${dirs[*]}")
