#!/usr/bin/env bash
# Gather what benchmarks/gpu_check.sh needs on a GPU machine without a package index, into one
# folder (default gpu_carry/, git-ignored): sdkit's wheels (python3 dev.py wheels), the runtime
# dependencies a bare CUDA + PyTorch + onnxruntime machine may lack (as wheels for its Python),
# libggml-python's sdist (the ggml sources native_build --cuda compiles) and, with SDCPP=1,
# stable-diffusion-cpp-python's sdist. Run here, where pip can reach the index:
#
#   PYVER=3.12 benchmarks/gpu_carry.sh [gpu_carry]
#
# PYVER: the GPU machine's Python (binary wheels are per version). TORCH_PEERS=1 adds diffusers
# and transformers for the PyTorch rows (about 20 MB more). SDCPP=1 adds stable-diffusion-cpp-python's
# sdist (built there with CMAKE_ARGS=-DSD_CUDA=ON). OMIT="numpy pillow" drops wheels it already has.
# VULKAN=1 adds ggml's Vulkan build as the sdkit-ggml-vulkan wheel (tools/ggml_vulkan_wheel.py: from
# the build `python3 dev.py vulkan` leaves in the sdkit cache, else built now, ~8 min on 2 cores) and
# this machine's Vulkan loader (libvulkan.so.1), in vulkan/: 12 MB more, so pair it with OMIT.
set -euo pipefail
cd "$(dirname "$0")/.."
DEST="${1:-gpu_carry}"
PYVER="${PYVER:-3.12}"
GGML_VERSION="${GGML_VERSION:-0.20.2.post1}"
mkdir -p "$DEST/wheels"
python3 dev.py wheels
cp dist/*.whl "$DEST/wheels/"
binary=(--only-binary=:all: --python-version "$PYVER" --implementation cp
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
        --platform any --dest "$DEST/wheels" --find-links dist)
# Everything sdkit-core, sdkit-ggml and pytest need, resolved by pip (tokenizers brings huggingface-hub
# and its own); what the GPU machine already has is simply not used there.
wanted=(sdkit-core sdkit-ggml "libggml-python==$GGML_VERSION" pytest)
if [ "${TORCH_PEERS:-0}" = 1 ]; then
  wanted+=(diffusers transformers)
fi
python3 -m pip download "${binary[@]}" "${wanted[@]}"
python3 -m pip download --no-binary=:all: --no-deps --dest "$DEST" "libggml-python==$GGML_VERSION"
if [ "${SDCPP:-0}" = 1 ]; then
  python3 -m pip download --no-binary=:all: --no-deps --dest "$DEST" stable-diffusion-cpp-python
  python3 -m pip download "${binary[@]}" "scikit-build-core[pyproject]"
fi
if [ "${VULKAN:-0}" = 1 ]; then
  VK_BUILD="$(.venv/bin/python -c "import importlib.metadata as m; from sdkit.cache import cache_root; print(cache_root() / 'ggml-vulkan' / m.version('libggml-python'))")"
  if [ -f "$VK_BUILD/sdkit-native-build.json" ]; then
    .venv/bin/python tools/ggml_vulkan_wheel.py --build "$VK_BUILD" --dist "$DEST/vulkan"
  else
    .venv/bin/python tools/ggml_vulkan_wheel.py --dist "$DEST/vulkan"
  fi
  cp -L "$(/sbin/ldconfig -p | awk '/libvulkan.so.1 .*x86-64/ {print $NF; exit}')" "$DEST/vulkan/libvulkan.so.1"
fi
# OMIT="numpy pillow onnx": leave out wheels the GPU machine already has (a device call carries
# 64 MiB; stable-diffusion-cpp-python's sdist alone is about 21 MB).
for name in ${OMIT:-}; do
  rm -f "$DEST/wheels/$name"-[0-9]*.whl
done
du -sh "$DEST"
