#!/usr/bin/env bash
# Installs what memledger needs to build and test, when it is missing:
# Debian packages with apt-get, then the position-independent libunwind
# (scripts/build-deps.sh). Safe to run again: it only installs what is absent.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

packages=(g++ make meson ninja-build pkg-config dpkg-dev libabsl-dev catch2 libdw-dev libelf-dev
          libzstd-dev zlib1g-dev liblzma-dev libbz2-dev nlohmann-json3-dev libtomlplusplus-dev libyaml-cpp-dev libxml2-utils python3 valgrind)
# The pprof export (libprotobuf, protoc; the Python protobuf library reads the
# profiles back in the tests) and the HTML report's test in a real browser.
packages+=(libprotobuf-dev protobuf-compiler python3-protobuf chromium)
# The bundled example and the PyTorch client of the integration tests use
# Debian's PyTorch; python3-venv makes the environment for the others below.
packages+=(python3-torch python3-venv)
# The trace reader's fuzz target (tests/fuzz): clang with libFuzzer; zstd makes
# the compressed hostile traces of its corpus (tests/fuzz/make_corpus.py).
packages+=(clang libclang-rt-dev zstd)
# The replacement allocators that programs link in or preload (the
# allocator integration tests and the host benchmark run under each).
packages+=(libjemalloc2 libtcmalloc-minimal4 libmimalloc2.0)
# The pytest plugin's tests (tools/python/memledger/pytest_plugin.py).
packages+=(python3-pytest)
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

# TensorFlow and JAX (the other framework clients of the integration tests)
# come from PyPI, into a git-ignored virtual environment that also sees
# Debian's packages (PyTorch). Without network the client tests skip.
venv="$root/.venv"
if [[ ! -x "$venv/bin/python3" ]]; then
  /usr/bin/python3 -m venv --system-site-packages "$venv"
fi
if ! "$venv/bin/python3" -c "import importlib.util as u, sys; sys.exit(not (u.find_spec('tensorflow') and u.find_spec('jax')))"; then
  echo "memledger setup: installing tensorflow-cpu and jax[cpu] into $venv" >&2
  "$venv/bin/pip" install --quiet --disable-pip-version-check tensorflow-cpu 'jax[cpu]' ||
    echo "memledger setup: pip could not install tensorflow-cpu and jax[cpu]; their client tests will be skipped" >&2
fi

# PyTorch Lightning for the Lightning callback's test, in an environment of
# its own on Debian's PyTorch 1.13: Lightning 1.9 and later import
# torch.distributed's sharding modules, which fail on Python 3.11 with
# PyTorch 1.13, and newer torchmetrics pull PyTorch 2 from PyPI.
lightning_venv="$root/.venv-lightning"
if [[ ! -x "$lightning_venv/bin/python3" ]]; then
  /usr/bin/python3 -m venv --system-site-packages "$lightning_venv"
fi
if ! "$lightning_venv/bin/python3" -c "import importlib.util as u, sys; sys.exit(not u.find_spec('pytorch_lightning'))"; then
  echo "memledger setup: installing pytorch-lightning into $lightning_venv" >&2
  "$lightning_venv/bin/pip" install --quiet --disable-pip-version-check \
    'pytorch-lightning==1.6.5' 'torchmetrics==0.11.4' 'setuptools<70' ||
    echo "memledger setup: pip could not install pytorch-lightning; its test will be skipped" >&2
fi

# meson-python from PyPI for the wheel's test (tests/integration/test_wheel.py
# builds with `pip wheel --no-build-isolation` from $venv): it drives
# Debian's meson and ninja, the ones that configured build/, so the wheel's
# compile commands are build/'s and ccache serves them. Without network that
# test is skipped with a message.
if ! "$venv/bin/python3" -c "import importlib.util as u, sys; sys.exit(not u.find_spec('mesonpy'))"; then
  echo "memledger setup: installing meson-python into $venv" >&2
  "$venv/bin/pip" install --quiet --disable-pip-version-check meson-python ||
    echo "memledger setup: pip could not install meson-python; the wheel's test will be skipped" >&2
fi
