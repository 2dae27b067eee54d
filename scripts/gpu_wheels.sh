#!/usr/bin/env bash
# The pure-Python wheels the GPU suite needs beyond a CUDA-torch image (Python 3.12, torch >= 2.11, transformers,
# numpy, psutil, pytest present), downloaded into .whl/ to carry to a GPU machine without a package registry
# (docs/gpus-and-clusters.md). Run on a machine with a registry; about 3 MB in all.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> "$(git rev-parse --git-common-dir)/info/exclude"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
    tensordict==0.15.3 pyvers==0.2.3 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 \
    typing-inspection==0.4.5 typing-extensions==4.16.0
du -sh .whl
