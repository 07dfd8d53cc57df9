#!/usr/bin/env bash
# Every check that needs a CUDA device, in one go (four to five minutes on an H200, the
# CUDA extension's build 25-30 s of it, the last step as long as it is let run):
#
#   1. bench/device_check.py: device digests against the CPU, GB/s against copy-to-host
#      + blake3 and a device-to-device copy, pinned vs pageable transfers;
#   2. bench/frozen_encoder.py --device cuda: the per-row benchmark with the encoders,
#      the head and the bound on the GPU, with one more first epoch of each profiled
#      (where a step's time goes beside the module);
#   3. the tests marked `gpu`, which skip elsewhere (native kernels, pinned pool, the
#      per-row cache's device tier and its writer staging through pinned memory, a first
#      epoch's batches run before their names come back from the device, deferred inputs
#      loaded onto the device, a wrapped module's answers on its input's device);
#   4. the rest of those tests' files, where CUDA is present, in the time left.
#
# Run from the repository root with a python3 that has a CUDA build of torch, pytest,
# pyarrow, safetensors, numpy and blake3:  bash bench/gpu_checks.sh
# A pre-flight checks all of them first and exits 2, naming what is missing.
# A machine that cannot download may lack blake3: wheels put in .whl/ beforehand are
# installed from there, offline, when it is missing. Make them here with
#   pip download blake3 -d .whl --only-binary=:all: --python-version 3.12 \
#     --platform manylinux2014_x86_64
# (the Python version of the machine that runs the checks). .whl/ is git-ignored, so
# it is not part of a copy of the working tree: carry it to that machine by name.
# Each step runs even when one before it failed, under its own time limit (150 + 150 +
# 60 + 180 s, so the whole script ends within about 540 s, under a 600 s limit on one
# command); the exit status says whether all passed. Where $OUT is set, the whole log is
# written there too, so the figures printed first survive a long failure after them.
set -uo pipefail
if [ -n "${OUT:-}" ]; then
  exec > >(tee -a "$OUT/gpu_checks.log") 2>&1
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# One cache for the CUDA extension, so the tests load what the device check built.
export SOMATIZE_EXT_CACHE="${SOMATIZE_EXT_CACHE:-$HOME/.cache/somatize/ext}"
if ! python3 -c 'import blake3' 2>/dev/null && [ -d .whl ]; then
  # Into the interpreter's environment if it may be written, else beside it.
  python3 -m pip install -q --no-index --find-links .whl blake3 2>/dev/null \
    || { python3 -m pip install -q --no-index --no-deps --target /tmp/somatize-site .whl/blake3-*.whl \
         && export PYTHONPATH="$PYTHONPATH:/tmp/somatize-site"; }
fi
# Pre-flight: everything the steps need, reported at once, before any step runs.
python3 - <<'PY' || exit 2
import importlib
import sys

missing = []
for name in ("torch", "pytest", "pyarrow", "safetensors", "numpy", "blake3"):
    try:
        importlib.import_module(name)
    except ImportError:
        missing.append(name)
if "torch" not in missing:
    import torch

    if not torch.cuda.is_available():
        missing.append(f"torch with CUDA (torch {torch.__version__} sees no CUDA device)")
if missing:
    hint = " (put its wheel in .whl/ and carry it: see the header)" if "blake3" in missing else ""
    print(f"gpu_checks.sh cannot run: missing {', '.join(missing)}{hint}", file=sys.stderr)
    sys.exit(2)
PY
failed=0
files=(tests/test_native_host.py tests/test_torch_residency.py tests/test_torch_run_ahead.py tests/test_torch_deferred.py tests/test_torch_wrap.py)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
python3 -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda)'
timeout 150 python3 bench/device_check.py || failed=1
timeout 150 python3 bench/frozen_encoder.py --device cuda --repeats 3 --profile-first || failed=1
timeout 60 python3 -m pytest -q -m gpu "${files[@]}" || failed=1
timeout 180 python3 -m pytest -q -m "not gpu" "${files[@]}" || failed=1
exit "$failed"
