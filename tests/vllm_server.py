"""Start a real `vllm serve` (OpenAI-compatible server) from the .venv-vllm environment for a test."""

from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
VENV_PY = ROOT / ".venv-vllm" / "bin" / "python"


def vllm_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    env.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # VLLMPolicy.load_weights
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra or {})
    return env


def venv_python_or_skip() -> Path:
    if not VENV_PY.exists():
        pytest.skip(f"{VENV_PY} does not exist; create it with `bash scripts/setup_vllm.sh`")
    probe = subprocess.run(
        [str(VENV_PY), "-c", "import vllm"], capture_output=True, text=True, env=vllm_env(), timeout=300
    )
    if probe.returncode != 0:
        pytest.skip(f"{VENV_PY} cannot import vllm: {probe.stderr.strip()[-500:]}")
    return VENV_PY


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def vllm_server(
    python: Path, model_dir: Path, name: str, workdir: Path, extra_env: Mapping[str, str] | None = None
) -> Iterator[str]:
    """Serve `model_dir` as `name` on a free port; yields the API root (".../v1")."""
    port = free_port()
    log_path = workdir / "server.log"
    cmd = [
        str(python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir), "--served-model-name", name,
        "--host", "127.0.0.1", "--port", str(port),
        "--max-model-len", "1024", "--dtype", "float32", "--enforce-eager",
    ]  # fmt: skip
    with open(log_path, "w") as log:
        server = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=vllm_env(extra_env), cwd=workdir
        )
    try:
        url = f"http://127.0.0.1:{port}/v1"
        deadline = time.monotonic() + 240
        while True:
            if server.poll() is not None:
                pytest.fail(f"vLLM server exited with {server.returncode}:\n{log_path.read_text()[-4000:]}")
            try:
                with urllib.request.urlopen(f"{url}/models", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"vLLM server not up after 240 s:\n{log_path.read_text()[-4000:]}")
            time.sleep(1)
        yield url
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=30)
