#!/usr/bin/env bash
# Builds the position-independent static libraries the preload library links.
#
# Debian's libunwind.a is not compiled with -fPIC, so it cannot be linked into
# a shared object. We build the same release from Debian's source package with
# -fPIC into deps/prefix (ignored by git). Idempotent: does nothing when the
# library is already there. scripts/install-deps.sh runs it with its output
# in build/setup.log.
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
    echo "adding Debian's source index (deb-src) to fetch libunwind's sources"
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
  apt-get source -qq libunwind
fi
dir=$(ls -d libunwind-*/ | head -n 1)
cd "$dir"
./configure -q --prefix="$prefix" --enable-static --disable-shared \
  --disable-minidebuginfo --disable-zlibdebuginfo --disable-tests \
  --disable-documentation --disable-coredump --disable-ptrace --disable-setjmp \
  CFLAGS="-O2 -g -fPIC"
make -s -j"$(nproc)"
make -s install
echo "built a position-independent libunwind in $prefix"
