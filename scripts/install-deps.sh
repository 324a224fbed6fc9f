#!/usr/bin/env bash
# Installs what memledger needs to build and test, when it is missing:
# Debian packages with apt-get, then the position-independent libunwind
# (scripts/build-deps.sh). Safe to run again: it only installs what is absent.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

packages=(g++ make meson ninja-build pkg-config dpkg-dev libabsl-dev catch2 libdw-dev libelf-dev
          libzstd-dev zlib1g-dev liblzma-dev libbz2-dev nlohmann-json3-dev libtomlplusplus-dev python3 valgrind)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "memledger setup: installing ${missing[*]}" >&2
  sudo=""
  [[ $(id -u) -eq 0 ]] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
"$root/scripts/build-deps.sh"
