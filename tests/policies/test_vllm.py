"""vLLM integration: VLLMPolicy in the .venv-vllm environment, OpenAIPolicy against its server.

Both tests need the vLLM virtual environment (`bash scripts/setup_vllm.sh`) and are
marked `vllm`: run them with `python -m pytest -m vllm tests/policies/test_vllm.py`.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ..vllm_server import venv_python_or_skip, vllm_env, vllm_server

pytestmark = pytest.mark.vllm

ROOT = Path(__file__).resolve().parents[2]
SMOKE = Path(__file__).with_name("vllm_smoke.py")


@pytest.fixture(scope="module")
def venv_python() -> Path:
    return venv_python_or_skip()


def test_vllm_policy_smoke(venv_python: Path) -> None:
    t0 = time.monotonic()
    proc = subprocess.run(
        [str(venv_python), str(SMOKE)], capture_output=True, text=True, env=vllm_env(), cwd=ROOT, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    r: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    print(
        f"vllm smoke: {time.monotonic() - t0:.0f} s total, engine start {r['startup_s']:.0f} s, "
        f"{r['throughput']['tokens_per_s']:.0f} tokens/s at 4 requests x 4 samples"
    )

    base = r["base"]
    assert len(base) == 3 and not any(g["error"] for g in base)
    for g in base:
        assert g["prompt_tokens"] == g["n_prompt_ids"] > 0
        assert len(g["logprobs"]) == len(g["token_ids"]) > 0
        assert all(lp <= 0 and math.isfinite(lp) for lp in g["logprobs"])
        assert g["finish_reason"] in ("stop", "length")
    # stop strings stay in the text (include_stop_str_in_output)
    assert any(g["text"].endswith(tuple(r["stop"])) for g in base)
    # siblings of one request differ; the same seed gives the same samples
    assert len({tuple(g["token_ids"]) for g in base}) > 1
    assert [g["token_ids"] for g in r["again"]] == [g["token_ids"] for g in base]
    # the next seed shares no sample with this one (vLLM seeds child j with seed + j)
    assert not {tuple(g["token_ids"]) for g in r["other_seed"]} & {tuple(g["token_ids"]) for g in base}

    (greedy,) = r["greedy_long"]
    assert greedy["finish_reason"] == "length" and len(greedy["token_ids"]) == 8

    # a request the engine rejects fails alone; the rest of the batch came back above
    bad = r["bad"]
    assert len(bad) == 2 and all(g["finish_reason"] == "error" for g in bad)
    assert "context length" in bad[0]["error"]

    assert r["throughput"]["tokens"] > 0

    load = r["load_weights"]
    assert load["ok"], load.get("error")
    assert load["changed"]["logprobs"] != pytest.approx(load["before"]["logprobs"], abs=1e-3)
    assert load["restored"]["logprobs"] == pytest.approx(load["before"]["logprobs"], abs=1e-3)


def test_openai_policy_against_vllm_server(venv_python: Path, tmp_path: Path) -> None:
    pytest.importorskip("openai", reason="needs the `openai` extra: pip install 'trace-gym[openai]'")
    from trace_gym.policies.openai_compat import OpenAIPolicy
    from trace_gym.types import GenerationRequest, message

    model_dir = tmp_path / "tiny"
    subprocess.run(
        [str(venv_python), str(SMOKE), "--save", str(model_dir)],
        check=True,
        env=vllm_env(),
        cwd=ROOT,
        timeout=300,
    )
    t0 = time.monotonic()
    with vllm_server(venv_python, model_dir, "tiny", tmp_path) as url:
        startup = time.monotonic() - t0
        policy = OpenAIPolicy(url, "tiny", timeout=60, max_retries=1, return_token_ids=True)
        tools = ({"type": "function", "function": {"name": "advance", "parameters": {"type": "object"}}},)
        msgs = (message("user", "What is the value after three steps?"),)
        stop = ("e", "a", "</tool_call>")
        request = GenerationRequest(msgs, n=3, max_new_tokens=24, stop=stop, seed=7, tools=tools)
        greedy = GenerationRequest(msgs, n=1, temperature=0.0, max_new_tokens=8, seed=1)
        t1 = time.monotonic()
        out = policy.generate([request, greedy])
        again = policy.generate([request])
        print(f"vllm server: up in {startup:.0f} s; first batch {time.monotonic() - t1:.1f} s")

        gens = out[0]
        assert len(gens) == 3 and not any(g.failed for g in gens), [g.error for g in gens]
        for g in gens:
            assert g.logprobs is not None and len(g.logprobs) > 0
            # vLLM's `return_token_ids` fills the ids (OpenAIPolicy(return_token_ids=True))
            assert g.completion_token_ids is not None and len(g.completion_token_ids) == len(g.logprobs)
            assert g.prompt_token_ids is not None and len(g.prompt_token_ids) == g.prompt_tokens > 0
        # the server strips the stop string; OpenAIPolicy appends the one vLLM reports
        assert any(g.text.endswith(stop) for g in gens if g.finish_reason == "stop")
        assert [g.text for g in again[0]] == [g.text for g in gens]
        assert out[1][0].finish_reason == "length" and out[1][0].completion_tokens == 8
        policy.close()
    assert sys.executable  # the policy ran in the main environment, the server in .venv-vllm
