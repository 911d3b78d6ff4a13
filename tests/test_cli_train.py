import json
from pathlib import Path
from typing import Any

import pytest

from trace_gym.cli import main

pytest.importorskip("trl", reason="needs the train extra: pip install 'trace-gym[train]'")
torch = pytest.importorskip("torch", reason="needs the hf extra: pip install 'trace-gym[hf]'")

EXAMPLES = Path(__file__).parent.parent / "examples"


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def write_config(tmp_path: Path, **extra: object) -> Path:
    lines = [
        "model: tiny",
        "sampler: uniform",
        "group_size: 2",
        "env_id: trace_gym/SyntheticTree-v0",
        "env_kwargs: {num_tasks: 8, min_steps: 1, max_steps: 2, extra_turns: 0}",
        "roots: 4",
        "continuations_per_root: 0",
        "max_per_prompt: 2",
        "candidates: 2",
        "max_steps: 3",
        "max_completion_length: 6",
        f"output_dir: {tmp_path / 'run'}",
        "save_strategy: 'no'",
        "report_to: none",
        "logging_steps: 1",
        "per_device_train_batch_size: 2",
        "num_generations: 2",
        "gradient_checkpointing: false",
        "disable_tqdm: true",
    ] + [f"{k}: {v}" for k, v in extra.items()]
    path = tmp_path / "train.yaml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_train_reads_the_yaml_and_flags_override_it(tmp_path, capsys):
    config = write_config(tmp_path)
    summary = tmp_path / "summary.json"
    code = main(["train", "--config", str(config), "--max_steps", "1", "--summary", str(summary)])
    assert code == 0
    out = capsys.readouterr().out
    assert "trained 1 steps with sampler uniform on trace_gym/SyntheticTree-v0: 4 rollouts" in out
    data = json.loads(summary.read_text())
    assert data["steps"] == 1 and data["rollouts"] == 4 and len(data["reward_per_logged_step"]) == 1


def test_bad_train_configs_are_explained(tmp_path, capsys):
    assert main(["train", "--config", str(write_config(tmp_path)), "--group_size", "3"]) == 2
    assert "in groups of 3, which does not divide it" in capsys.readouterr().err
    assert main(["train", "--config", str(write_config(tmp_path, no_such_option=1))]) == 2
    assert "Unknown arguments from config file" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["train", "--config", str(write_config(tmp_path)), "--sampler", "best"])
    assert "invalid choice: 'best'" in capsys.readouterr().err
    assert main(["train", "--config", str(write_config(tmp_path)), "--use_vllm", "true"]) == 2
    assert "generation=vllm-server" in capsys.readouterr().err


def test_other_commands_still_refuse_unknown_flags(capsys):
    with pytest.raises(SystemExit):
        main(["envs", "--max_steps", "3"])
    assert "unrecognized arguments: --max_steps 3" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["train_smollm2_cpu.yaml", "train_vllm_gpu.yaml", "train_vllm_server.yaml"])
def test_example_configs_parse(name):
    from trl.scripts.utils import TrlParser

    from trace_gym.trainers.script import TrainScriptArguments
    from trace_gym.trainers.tree_grpo import TreeGRPOConfig

    types: list[Any] = [TrainScriptArguments, TreeGRPOConfig]
    parser = TrlParser(types)
    # bf16 off so the GPU example validates on a CPU machine too
    script, config = parser.parse_args_and_config(["--config", str(EXAMPLES / name), "--bf16", "false"])
    assert config.budget.total == config.roots * (1 + config.continuations_per_root)
    assert script.sampler == "trace" and config.max_steps > 0


def test_server_generation_builds_a_vllm_server_policy(tmp_path):
    pytest.importorskip("openai", reason="needs the openai extra: pip install 'trace-gym[openai]'")
    from trl.scripts.utils import TrlParser

    from trace_gym.policies.vllm_server import VLLMServerPolicy
    from trace_gym.trainers.script import TrainScriptArguments, build_trainer
    from trace_gym.trainers.tree_grpo import TreeGRPOConfig

    path = write_config(tmp_path, generation="vllm-server", vllm_server_port=8123)
    types: list[Any] = [TrainScriptArguments, TreeGRPOConfig]
    script, config = TrlParser(types).parse_args_and_config(["--config", str(path)])
    trainer = build_trainer(script, config)
    policy = trainer.policy
    assert isinstance(policy, VLLMServerPolicy)
    assert (policy.base_url, policy.model) == ("http://0.0.0.0:8123/v1", "tiny")
    assert policy.weights_dir == tmp_path / "run" / "vllm_weights"
    assert policy.return_token_ids
    script.served_model_name, config.vllm_server_base_url = "policy", "http://host:9/"
    script.vllm_weights_dir = str(tmp_path / "shared")
    policy = build_trainer(script, config).policy
    assert isinstance(policy, VLLMServerPolicy)
    assert (policy.base_url, policy.model, policy.weights_dir) == (
        "http://host:9/v1",
        "policy",
        tmp_path / "shared",
    )
