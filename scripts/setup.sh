#!/usr/bin/env bash
# Installs trace-gym and everything it needs on a fresh machine.
#   bash scripts/setup.sh        # the package with what `trace-gym compare` needs (plots, YAML)
#   bash scripts/setup.sh dev    # plus the test and lint tools
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
extras="${1:-compare}"
# torch first, pinned to the CPU wheel: anything that later depends on torch must not pull
# a multi-GB CUDA build.
python -m pip install --quiet torch==2.13.0
python -m pip install --quiet -e ".[${extras}]"
