#!/usr/bin/env bash
# Here, with network: stage everything the lent NVIDIA machine (no package registry) needs.
#   .gpuA/ .gpuB/  MLX's CUDA backend in two parts (../shared/device/prepare_mlx_cuda.sh)
#   .whl/          the Python 3.12 wheels the harness needs beyond what that machine's python has
# All three are git-ignored. Then see ci/gpu/run.sh for the two device calls.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ ! -f .gpuB/activate.sh ]; then
    bash ../shared/device/prepare_mlx_cuda.sh
fi
platforms=()
for tag in manylinux_2_35 manylinux_2_34 manylinux_2_31 manylinux_2_28 manylinux_2_27 manylinux_2_24 \
           manylinux_2_17 manylinux2014 manylinux_2_12 manylinux2010 manylinux_2_5 manylinux1; do
    platforms+=(--platform "${tag}_x86_64")
done
rm -rf .whl && mkdir .whl
# The device's python already has numpy, tokenizers, safetensors, transformers, jinja2, pyyaml,
# protobuf and sentencepiece; everything else of the engine and fuzz extras travels.
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" --platform any -d .whl -r ci/gpu/wheels.txt
du -sh .gpuA .gpuB .whl
