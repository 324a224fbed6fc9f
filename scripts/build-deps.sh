#!/usr/bin/env bash
# Builds the position-independent static libraries the preload library links.
#
# Debian's libunwind.a is not compiled with -fPIC, so it cannot be linked into
# a shared object. We build the same release from Debian's source package with
# -fPIC into deps/prefix (ignored by git). Idempotent: does nothing when the
# library is already there.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
prefix="$root/deps/prefix"
if [[ -f "$prefix/lib/libunwind.a" && -f "$prefix/include/libunwind.h" ]]; then
  exit 0
fi
src="$root/deps/src"
mkdir -p "$src"
cd "$src"
if ! ls -d libunwind-*/ >/dev/null 2>&1; then
  if ! apt-get source --download-only -qq libunwind >/dev/null 2>&1; then
    echo "memledger setup: adding Debian's source index (deb-src) to fetch libunwind's sources" >&2
    . /etc/os-release
    cat > /etc/apt/sources.list.d/memledger-src.sources <<SRC
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: ${VERSION_CODENAME:-bookworm}
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
    apt-get update -qq
  fi
  apt-get source -qq libunwind >/dev/null 2>&1
fi
dir=$(ls -d libunwind-*/ | head -n 1)
cd "$dir"
./configure -q --prefix="$prefix" --enable-static --disable-shared \
  --disable-minidebuginfo --disable-zlibdebuginfo --disable-tests \
  --disable-documentation --disable-coredump --disable-ptrace --disable-setjmp \
  CFLAGS="-O2 -g -fPIC" >/dev/null
make -s -j"$(nproc)" >/dev/null 2>&1
make -s install >/dev/null 2>&1
echo "memledger setup: built position-independent libunwind in $prefix" >&2
