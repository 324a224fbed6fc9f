#!/usr/bin/env bash
# Installs what memledger needs, when it is missing. The mode says for what:
#   example  what `scripts/example.sh` needs: the build dependencies, the
#            position-independent libunwind (scripts/build-deps.sh) and
#            Debian's PyTorch for the bundled example;
#   all      (default) that, and what the test suite uses: Catch2, clang, the
#            replacement allocators, valgrind, chromium, pytest, pyte, and
#            TensorFlow, JAX, Lightning and meson-python from PyPI in .venv
#            and .venv-lightning.
# Safe to run again: it only installs what is absent. Each step prints one
# line; the tools' own output goes to build/setup.log, whose end is printed
# when a step fails.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
mode=${1:-all}
case "$mode" in
  example|all) ;;
  *) echo "usage: $0 [example|all]" >&2; exit 2 ;;
esac
. "$root/scripts/setup-steps.sh"

# Building memledger: the compiler, meson, and the libraries the preload
# library, the report and the command link (the pprof export's protobuf
# included); dpkg-dev fetches libunwind's sources (scripts/build-deps.sh).
packages=(g++ make meson ninja-build pkg-config dpkg-dev libabsl-dev libdw-dev libelf-dev
          libzstd-dev zlib1g-dev libdeflate-dev liblzma-dev libbz2-dev nlohmann-json3-dev libtomlplusplus-dev
          libyaml-cpp-dev libprotobuf-dev protobuf-compiler python3)
# The bundled example and the PyTorch client of the integration tests use
# Debian's PyTorch.
packages+=(python3-torch)
if [[ $mode == all ]]; then
  # The unit tests, the XML checks, valgrind's test setup; the Python
  # protobuf library reads the pprof profiles back; the HTML report's test in
  # a real browser; python3-venv makes the environments below.
  packages+=(catch2 libxml2-utils valgrind python3-protobuf chromium python3-venv)
  # gdb: a test command that runs past its timeout prints its processes'
  # stacks before they are killed (tests/integration/mltest.py).
  packages+=(gdb)
  # The trace reader's fuzz target (tests/fuzz): clang with libFuzzer; zstd
  # makes the compressed hostile traces of its corpus (tests/fuzz/make_corpus.py).
  packages+=(clang libclang-rt-dev zstd)
  # The replacement allocators that programs link in or preload (the
  # allocator integration tests and the host benchmark run under each).
  packages+=(libjemalloc2 libtcmalloc-minimal4 libmimalloc2.0)
  # The pytest plugin's tests (tools/python/memledger/pytest_plugin.py), and
  # the terminal emulator that the status line's test draws the terminal with.
  packages+=(python3-pytest python3-pyte)
fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""
  [[ $(id -u) -eq 0 ]] || sudo=sudo
  setup_step "installing ${#missing[@]} Debian packages (${missing[*]})" \
    bash -c "$sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends $(printf '%q ' "${missing[@]}")"
else
  setup_note "Debian packages: all there"
fi

if [[ -f "$root/deps/prefix/lib/libunwind.a" && -f "$root/deps/prefix/include/libunwind.h" ]]; then
  setup_note "position-independent libunwind: in deps/prefix"
else
  setup_step "building a position-independent libunwind from Debian's sources into deps/prefix" \
    "$root/scripts/build-deps.sh"
fi

[[ $mode == all ]] || exit 0

# TensorFlow and JAX (the other framework clients of the integration tests)
# come from PyPI, into a git-ignored virtual environment that also sees
# Debian's packages (PyTorch). Without network the client tests skip.
venv="$root/.venv"
if [[ ! -x "$venv/bin/python3" ]]; then
  setup_step "making the virtual environment .venv" /usr/bin/python3 -m venv --system-site-packages "$venv"
fi
if "$venv/bin/python3" -c "import importlib.util as u, sys; sys.exit(not (u.find_spec('tensorflow') and u.find_spec('jax')))"; then
  setup_note "tensorflow-cpu and jax[cpu]: in .venv"
else
  setup_step_optional "installing tensorflow-cpu and jax[cpu] into .venv" "their client tests will be skipped" \
    "$venv/bin/pip" install --disable-pip-version-check --progress-bar off tensorflow-cpu 'jax[cpu]'
fi

# PyTorch Lightning for the Lightning callback's test, in an environment of
# its own on Debian's PyTorch 1.13: Lightning 1.9 and later import
# torch.distributed's sharding modules, which fail on Python 3.11 with
# PyTorch 1.13, and newer torchmetrics pull PyTorch 2 from PyPI.
lightning_venv="$root/.venv-lightning"
if [[ ! -x "$lightning_venv/bin/python3" ]]; then
  setup_step "making the virtual environment .venv-lightning" \
    /usr/bin/python3 -m venv --system-site-packages "$lightning_venv"
fi
if "$lightning_venv/bin/python3" -c "import importlib.util as u, sys; sys.exit(not u.find_spec('pytorch_lightning'))"; then
  setup_note "pytorch-lightning: in .venv-lightning"
else
  setup_step_optional "installing pytorch-lightning into .venv-lightning" "its test will be skipped" \
    "$lightning_venv/bin/pip" install --disable-pip-version-check --progress-bar off \
    'pytorch-lightning==1.6.5' 'torchmetrics==0.11.4' 'setuptools<70'
fi

# meson-python from PyPI for the wheel's test (tests/integration/test_wheel.py
# builds with `pip wheel --no-build-isolation` from $venv): it drives
# Debian's meson and ninja, the ones that configured build/, so the wheel's
# compile commands are build/'s and ccache serves them. Without network that
# test is skipped with a message.
if "$venv/bin/python3" -c "import importlib.util as u, sys; sys.exit(not u.find_spec('mesonpy'))"; then
  setup_note "meson-python: in .venv"
else
  setup_step_optional "installing meson-python into .venv" "the wheel's test will be skipped" \
    "$venv/bin/pip" install --disable-pip-version-check --progress-bar off meson-python
fi

# JupyterLab and ipykernel in .venv for the Jupyter test (memledger run --
# jupyter lab: the kernels' verdicts in the job table).
if "$venv/bin/python3" -c "import importlib.util as u, sys; sys.exit(not (u.find_spec('jupyterlab') and u.find_spec('ipykernel')))"; then
  setup_note "jupyterlab and ipykernel: in .venv"
else
  setup_step_optional "installing jupyterlab and ipykernel into .venv" "the Jupyter test will be skipped" \
    "$venv/bin/pip" install --disable-pip-version-check --progress-bar off jupyterlab ipykernel
fi
