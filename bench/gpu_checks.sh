#!/usr/bin/env bash
# Every check that needs a CUDA device, in one go (a few minutes on an H100/H200-class
# GPU, most of it building the CUDA extension):
#
#   1. bench/device_check.py: device digests against the CPU, GB/s against copy-to-host
#      + blake3 and a device-to-device copy, pinned vs pageable transfers;
#   2. the test files whose CUDA tests skip elsewhere (native kernels, pinned pool, the
#      per-row cache's device tier and its writer staging through pinned memory, deferred
#      inputs loaded onto the device);
#   3. bench/frozen_encoder.py --device cuda: the per-row benchmark with the encoders,
#      the head and the bound on the GPU.
#
# Run from the repository root with a python3 that has a CUDA build of torch, pytest,
# pyarrow, safetensors and blake3:  bash bench/gpu_checks.sh
# A machine that cannot download may lack blake3: wheels put in .whl/ beforehand (e.g.
# `pip download blake3 -d .whl --only-binary=:all: --python-version 3.12
# --platform manylinux2014_x86_64`) are installed from there, offline, when it is missing.
# Each step runs even when one before it failed; the exit status says whether all passed.
set -uo pipefail
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
python3 -c 'import torch; assert torch.cuda.is_available(), "no CUDA device here"' || exit 2
if ! python3 -c 'import blake3' 2>/dev/null && [ -d .whl ]; then
  python3 -m pip install -q --no-index --find-links .whl blake3 || exit 2
fi
failed=0
python3 bench/device_check.py || failed=1
python3 -m pytest -q tests/test_native_host.py tests/test_torch_residency.py tests/test_torch_deferred.py || failed=1
python3 bench/frozen_encoder.py --device cuda --repeats 5 || failed=1
exit "$failed"
