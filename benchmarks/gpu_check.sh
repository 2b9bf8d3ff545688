#!/usr/bin/env bash
# One call on a bare GPU machine (CUDA's nvcc, CMake, PyTorch, onnxruntime; no package index):
# install sdkit from the carried wheels, build ggml with CUDA, run every `gpu`-marked test and
# the whole-image + VAE benchmark, and write one JSON, $OUT/gpu_check.json. Budget: 8 minutes.
#
#   benchmarks/gpu_check.sh [CARRY]          # CARRY: what benchmarks/gpu_carry.sh gathered
#   DRY_RUN=1 benchmarks/gpu_check.sh        # no GPU: everything up to the GPU-specific parts
#
# Steps (each timed in the JSON): a venv with the system's packages (PyTorch, onnxruntime) plus
# the carried wheels (pip --no-index); `native_build --cuda --sources <sdist>` (the GPU's own
# architecture); with SDCPP=1 and its sdist carried, stable-diffusion-cpp-python with
# CMAKE_ARGS=-DSD_CUDA=ON; `pytest -m gpu` over every package; gpu_whole_image.py (SD 1.5 512 px
# and SDXL 1024 px, VAE 512/1024 px). DRY_RUN=1 installs the same way, runs the build's
# pre-flight and source check only (`native_build --check`), the gpu tests (they skip without a
# GPU) and the whole-image script at --tiny size on the CPU. MODELS=sd1 leaves SDXL out and
# WHOLE_IMAGE_S bounds the benchmark (330 s); its JSON is written after each model. With the
# Vulkan wheel carried (gpu_carry.sh VULKAN=1): the `vulkan` tests and the SD 1.5 whole image on
# ggml's vulkan:0 (VULKAN_S bounds it, 200 s), in a process of its own (SDKIT_GGML_LIB_DIR), the
# carried loader used only where the machine has none; the GPU driver must bring its Vulkan ICD
# (containers often mount the compute libraries only: the devices step then lists no vulkan:0).
# UPSCALER=1: benchmarks/upscaler.py on cuda:0 (ESRGAN x4plus and Compact at 256 px, the
# conv_concat pass on and off; UPSCALER_S bounds it, 150 s).
set -uo pipefail
cd "$(dirname "$0")/.."
CARRY="$(realpath "${1:-gpu_carry}")"
OUT="${OUT:-$PWD/gpu-check-out}"
DRY_RUN="${DRY_RUN:-0}"
mkdir -p "$OUT"
STEPS="$OUT/steps.jsonl"
: > "$STEPS"
START=$(date +%s)

step() {  # step NAME COMMAND...: run, log to $OUT/NAME.log, record rc and seconds
  local name="$1"; shift
  local t0=$(date +%s)
  echo "== $name ($(( t0 - START )) s in)"
  "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "{\"step\": \"$name\", \"rc\": $rc, \"seconds\": $(( $(date +%s) - t0 ))}" >> "$STEPS"
  tail -3 "$OUT/$name.log"
  return $rc
}

VENV="$OUT/venv"
python3 -m venv --system-site-packages "$VENV"
PY="$VENV/bin/python"
export SDKIT_CACHE_DIR="$OUT/cache"
step install "$PY" -m pip install --no-index --find-links "$CARRY/wheels" sdkit-core sdkit-ggml pytest || exit 1
# sdkit-trt for its gpu tests; its TensorRT-RTX and cuda-bindings wheels are too big to carry (they skip)
step install_trt "$PY" -m pip install --no-index --no-deps --find-links "$CARRY/wheels" sdkit-trt
SDIST="$(ls "$CARRY"/libggml_python-*.tar.gz | head -1)"
if [ "$DRY_RUN" = 1 ]; then
  step build "$PY" -m sdkit_ggml.runtime.native_build --cuda --cuda-arch 90 --sources "$SDIST" --check
else
  step build "$PY" -m sdkit_ggml.runtime.native_build --cuda --sources "$SDIST" --jobs "$(nproc)"
fi
SDCPP_SDIST="$(ls "$CARRY"/stable_diffusion_cpp_python-*.tar.gz 2>/dev/null | head -1)"
if [ "${SDCPP:-0}" = 1 ] && [ -n "$SDCPP_SDIST" ] && [ "$DRY_RUN" != 1 ]; then
  ARCH="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d '.')"
  step sdcpp_deps "$PY" -m pip install --no-index --find-links "$CARRY/wheels" scikit-build-core
  CMAKE_ARGS="-DSD_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=$ARCH" step sdcpp timeout "${SDCPP_S:-300}" \
    "$PY" -m pip install --no-index --find-links "$CARRY/wheels" --no-build-isolation "$SDCPP_SDIST"
fi
step devices "$PY" -c "import sdkit.selection as s; print([str(d) for d in s.get_backend('ggml').devices()])"
mapfile -t GPU_TESTS < <(grep -rl "pytest.mark.gpu" packages/*/tests --include="test_*.py")
step gpu_tests "$PY" -m pytest -m gpu "${GPU_TESTS[@]}" -q -p no:cacheprovider --junitxml="$OUT/gpu_tests.xml"
if [ "$DRY_RUN" = 1 ]; then
  step whole_image "$PY" benchmarks/gpu_whole_image.py --tiny --runs 2 --max-warmup 3 --out "$OUT/whole_image.json"
else
  step whole_image timeout "${WHOLE_IMAGE_S:-330}" "$PY" benchmarks/gpu_whole_image.py --models "${MODELS:-sd1,sdxl}" \
    --runs 3 --max-warmup 4 --timeout 240 \
    --scratch "$OUT/scratch" --out "$OUT/whole_image.json"
fi
if [ "${UPSCALER:-0}" = 1 ] && [ "$DRY_RUN" != 1 ]; then  # ESRGAN x4plus, pass conv_concat on and off
  step upscaler timeout "${UPSCALER_S:-150}" "$PY" benchmarks/upscaler.py --device cuda:0 --configs x4plus,general \
    --size 256 --repeat 5 --no-seams --ggml-variants default,SDKIT_GGML_PASSES_OFF=conv_concat --json "$OUT/upscaler.json"
fi
VK_WHEEL="$(ls "$CARRY"/vulkan/sdkit_ggml_vulkan-*.whl 2>/dev/null | head -1)"
if [ -n "$VK_WHEEL" ]; then
  step vulkan_install "$PY" -m pip install --no-index --no-deps --target "$OUT/vk" "$VK_WHEEL"
  VK=(env SDKIT_GGML_LIB_DIR="$OUT/vk/sdkit_ggml_vulkan/lib")
  if ! /sbin/ldconfig -p | grep -q "libvulkan.so.1 "; then
    VK+=(LD_LIBRARY_PATH="$CARRY/vulkan:${LD_LIBRARY_PATH:-}")
  fi
  if [ "$DRY_RUN" = 1 ]; then
    VK+=(GGML_VK_VISIBLE_DEVICES=0)  # no GPU: Mesa's lavapipe, if installed, stands in
  fi
  step vulkan_devices "${VK[@]}" "$PY" -c "import sdkit.selection as s; print([str(d) for d in s.get_backend('ggml').devices()])"
  step vulkan_tests "${VK[@]}" "$PY" -m pytest -m "vulkan and not slow" packages/sdkit-ggml/tests/test_vulkan.py -q \
    -p no:cacheprovider --junitxml="$OUT/vulkan_tests.xml"
  if [ "$DRY_RUN" != 1 ]; then
    step vulkan_whole_image "${VK[@]}" timeout "${VULKAN_S:-200}" "$PY" benchmarks/gpu_whole_image.py --models sd1 \
      --engines sdkit-vulkan:0-fp16,sdkit-vulkan:0-fp32 --runs 3 --max-warmup 4 --timeout 180 \
      --scratch "$OUT/scratch" --out "$OUT/vulkan_whole_image.json"
  fi
fi
"$PY" - "$OUT" "$START" <<'PY'
import json, sys, time
from pathlib import Path
out = Path(sys.argv[1])
report = {"steps": [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines() if line.strip()],
          "seconds": time.time() - float(sys.argv[2])}
for name in ("whole_image", "vulkan_whole_image", "upscaler"):
    path = out / f"{name}.json"
    report[name] = json.loads(path.read_text()) if path.is_file() else None
for name in ("gpu_tests", "vulkan_tests"):
    tests = out / f"{name}.xml"
    if tests.is_file():
        import xml.etree.ElementTree as ET
        suite = ET.parse(tests).getroot()
        suite = suite if suite.tag == "testsuite" else suite[0]
        report[name] = {k: suite.get(k) for k in ("tests", "failures", "errors", "skipped", "time")}
(out / "gpu_check.json").write_text(json.dumps(report, indent=1))
print(f"gpu_check: {out / 'gpu_check.json'} ({report['seconds']:.0f} s)")
PY
rm -rf "$VENV" "$OUT/scratch" "$OUT/cache" "$OUT/vk"  # multi-GB checkpoints and the venv must not come back with $OUT
