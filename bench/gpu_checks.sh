#!/usr/bin/env bash
# Every check that needs a CUDA device, in one go (a few minutes on an H100/H200-class
# GPU, most of it building the CUDA extension):
#
#   1. bench/device_check.py: device digests against the CPU, GB/s against copy-to-host
#      + blake3 and a device-to-device copy, pinned vs pageable transfers;
#   2. the test files whose CUDA tests skip elsewhere (native kernels, pinned pool, the
#      per-row cache's device tier and its writer staging through pinned memory, deferred
#      inputs loaded onto the device, a wrapped module's answers on its input's device);
#   3. bench/frozen_encoder.py --device cuda: the per-row benchmark with the encoders,
#      the head and the bound on the GPU.
#
# Run from the repository root with a python3 that has a CUDA build of torch, pytest,
# pyarrow, safetensors and blake3:  bash bench/gpu_checks.sh
# A machine that cannot download may lack blake3: wheels put in .whl/ beforehand (e.g.
# `pip download blake3 -d .whl --only-binary=:all: --python-version 3.12
# --platform manylinux2014_x86_64`) are installed from there, offline, when it is missing.
# Each step runs even when one before it failed, under its own time limit; the exit
# status says whether all passed. Where $OUT is set, the whole log is written there too,
# so the figures printed first survive a long failure after them.
set -uo pipefail
if [ -n "${OUT:-}" ]; then
  exec > >(tee -a "$OUT/gpu_checks.log") 2>&1
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# One cache for the CUDA extension, so the tests load what the device check built.
export SOMATIZE_EXT_CACHE="${SOMATIZE_EXT_CACHE:-$HOME/.cache/somatize/ext}"
python3 -c 'import torch; assert torch.cuda.is_available(), "no CUDA device here"' || exit 2
if ! python3 -c 'import blake3' 2>/dev/null && [ -d .whl ]; then
  # Into the interpreter's environment if it may be written, else beside it.
  python3 -m pip install -q --no-index --find-links .whl blake3 2>/dev/null \
    || { python3 -m pip install -q --no-index --no-deps --target /tmp/somatize-site .whl/blake3-*.whl \
         && export PYTHONPATH="$PYTHONPATH:/tmp/somatize-site"; }
fi
python3 -c 'import blake3' || { echo "blake3 is missing: put its wheel in .whl/ (see above)"; exit 2; }
failed=0
timeout 240 python3 bench/device_check.py || failed=1
timeout 300 python3 -m pytest -q tests/test_native_host.py tests/test_torch_residency.py tests/test_torch_deferred.py tests/test_torch_wrap.py || failed=1
timeout 240 python3 bench/frozen_encoder.py --device cuda --repeats 5 || failed=1
exit "$failed"
