#!/bin/bash
# One prepared check on a machine with a CUDA GPU (a lent one has minutes, not hours):
# versions, the pack installed in place, the selftest (CUDA tests inside, JSON kept), the
# distributed tests with a generous timeout, then the whole unit suite with the GPU visible.
# Logs go to $OUT (or ./gpu-logs) whole: never pipe a timed step into tail.
# Wheels the machine lacks (diffusers, gguf, importlib_metadata, ...) may wait in ./.whl.
# Usage: bash benchmarks/gpu_check.sh      (ST_T, DIST_T, UT_T: seconds per step)
export PYTHONUNBUFFERED=1
OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 3
    export PYTHONPATH=/tmp/site
fi
nvidia-smi -L
python3 -c "import torch, sys; print(sys.version.split()[0], torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0))"
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . 2>&1 | tail -2
python3 -c "import comfyui_placement, diffusers, gguf" || exit 4
step() {   # name, seconds, command...
    local name=$1 t=$2; shift 2
    echo "== $name"; local t0=$(date +%s)
    timeout "$t" "$@" > "$OUT/$name.log" 2>&1; local rc=$?
    tail -25 "$OUT/$name.log"
    echo "$name rc=$rc in $(( $(date +%s) - t0 )) s"
}
step selftest "${ST_T:-240}" python3 -m comfyui_placement selftest --json "$OUT/selftest.json"
step distributed "${DIST_T:-200}" python3 -m pytest -q -p no:cacheprovider -rf \
    --timeout 120 tests/runtime/test_distributed.py
step units "${UT_T:-300}" python3 -m pytest -q -p no:cacheprovider -rf --timeout 60 \
    --deselect tests/runtime/test_distributed.py tests
