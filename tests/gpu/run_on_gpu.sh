#!/bin/bash
# The GPU suite and the GPU measurements, from a folder made by bundle.sh, in
# about six minutes on one GPU. Each run's report.json, the suites' logs and
# the measurements go to LOG_DIR (see results/ for what a run left there).
#
#   tests/gpu/run_on_gpu.sh BUNDLE LOG_DIR
set -uo pipefail
cd "$(dirname "$0")"
if ! nvidia-smi -L > /dev/null 2>&1; then
  echo "run_on_gpu.sh: no NVIDIA GPU here (nvidia-smi lists none)" >&2
  exit 77
fi
bundle=$(cd "$1" && pwd)
logs=$2
mkdir -p "$logs/reports"
logs=$(cd "$logs" && pwd)
export PYTHONUNBUFFERED=1 MEMLEDGER=$bundle/tools/memledger MEMLEDGER_GPU_REPORTS=$logs/reports MEMLEDGER_GPU_TIMEOUT=120
ml=$MEMLEDGER
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import sys, torch; print(sys.version.split()[0], 'torch', torch.__version__)"
} > "$logs/env.log" 2>&1

t0=$(date +%s)
timeout -k 5 300 python3 test_gpu.py > "$logs/gpu.log" 2>&1 &
timeout -k 5 300 python3 test_cupti_gpu.py CuptiMatchesHooks.test_cuda_cpp_client \
  CuptiMatchesHooks.test_pytorch_leak_mode CuptiMatchesHooks.test_nvtx_steps CuptiMatchesHooks.test_kernel_steps \
  CuptiMatchesHooks.test_coexists_with_torch_profiler > "$logs/cupti.log" 2>&1
wait
echo "suites: $(( $(date +%s) - t0 )) s" >> "$logs/env.log"

# What CUPTI recorded, by its own memory kind, for the two PyTorch allocator
# settings whose memory the hooks see per tensor or per mapping.
for conf in backend:cudaMallocAsync expandable_segments:True; do
  run=$(mktemp -d)
  PYTORCH_CUDA_ALLOC_CONF=$conf timeout -k 5 90 "$ml" run -q -o "$run" --host off --cupti on -- \
    python3 torch_cupti.py 20 leak > /dev/null
  echo "== CUPTI's records by kind, PYTORCH_CUDA_ALLOC_CONF=$conf"
  "$ml" dump "$run"/trace.*.mlt | awk '/^cupti_alloc/ {
      for (i = 2; i <= NF; i++) { split($i, a, "="); f[a[1]] = a[2] }
      n[f["cupti_kind"] " async=" f["flags"] % 2]++ }
    END { for (k in n) print n[k], k }'
  cp "$run/report.json" "$logs/reports/cupti_records_${conf%%:*}.json"
done > "$logs/cupti_records.log" 2>&1

{
  echo "== device_bench pairs 400000: untraced / --host off --cupti off / the same, --stack-depth 0 / --host off (CUPTI on)"
  for round in 1 2 3; do
    timeout 60 "$bundle/device_bench" pairs 400000
    for options in "--cupti off" "--cupti off --stack-depth 0" ""; do
      # shellcheck disable=SC2086
      timeout -k 5 60 "$ml" run -q --host off $options -o "$(mktemp -d)" -- "$bundle/device_bench" pairs 400000
    done
  done
  echo "== torch_cupti.py 300 timing, cudaMallocAsync: untraced / leak mode, CUPTI off / leak mode, CUPTI on"
  for round in 1 2 3; do
    PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync timeout 60 python3 torch_cupti.py 300 timing | sed -n 's/^/untraced /p' | grep -v DONE
    for cupti in off on; do
      timeout -k 5 60 "$ml" run -q --host off --leak-mode --cupti $cupti -o "$(mktemp -d)" -- python3 torch_cupti.py 300 timing |
        grep -v DONE | sed "s/^/cupti-$cupti /"
    done
  done
} > "$logs/bench.log" 2>&1
echo "all: $(( $(date +%s) - t0 )) s" >> "$logs/env.log"
