#!/bin/bash
# Issue 19 item 6 on a lent GPU, in one call: ComfyUI 0.29.0 set up from the pinned
# tarball, then benchmarks/comfy_offload.py for a full-size Flux.1 (12B) and Wan 2.1
# (14B) with random bf16 weights: ComfyUI core's offloading against the pack's streaming
# at one budget, seconds per step side by side. Logs and JSON whole in $OUT.
#
# The device image has torch and most of ComfyUI's requirements; what it lacks waits in
# the ignored folder .whl (carry it: run(..., carry=[".whl"])), made here with
#   mkdir -p .whl/comfy && cp ../shared/vendor/ComfyUI-0.29.0-*.tar.gz .whl/ &&
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
#     --platform manylinux_2_17_x86_64 -d .whl/comfy torchsde comfy-aimdo av alembic \
#     SQLAlchemy simpleeval blake3 trampoline
#   (comfy-kitchen, 68 MB, is optional to ComfyUI and over the carry limit: left out)
# plus diffusers, gguf, importlib_metadata in .whl itself (benchmarks/gpu_check.sh).
# Usage: bash benchmarks/gpu_comfy_offload.sh   (FLUX_T, WAN_T: seconds per family;
#        FLUX_BUDGET, WAN_BUDGET: GiB)
export PYTHONUNBUFFERED=1
OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl .whl/comfy/*.whl > "$OUT/pip.log" 2>&1 || { cat "$OUT/pip.log"; exit 3; }
export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . > /dev/null 2>&1
mkdir -p /tmp/comfyui && tar xzf .whl/ComfyUI-0.29.0-*.tar.gz -C /tmp/comfyui --strip-components=1
nvidia-smi -L
python3 -c "import torch; print(torch.__version__, torch.cuda.get_device_name(0))"
bench() {   # family, seconds, budget GiB
    echo "== $1 (budget $3 GiB)"; local t0=$(date +%s)
    timeout "$2" python3 benchmarks/comfy_offload.py --comfyui /tmp/comfyui \
        --work /tmp/co_$1 --family "$1" --budget-gib "$3" --steps 4 \
        --out "$OUT/comfy_offload_$1.json" > "$OUT/comfy_offload_$1.log" 2>&1
    local rc=$?
    grep -v "^WARNING\|^$" "$OUT/comfy_offload_$1.log" | tail -8
    echo "$1 rc=$rc in $(( $(date +%s) - t0 )) s"
}
bench flux1 "${FLUX_T:-240}" "${FLUX_BUDGET:-12}"
bench wan21 "${WAN_T:-300}" "${WAN_BUDGET:-16}"
