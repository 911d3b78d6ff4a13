"""Two steps of TreeGRPOTrainer in one process of a `torchrun` group; prints one JSON line.

torchrun --nproc_per_node 2 tests/trainers/ddp_run.py OUTPUT_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.trainers.parity_env import ENV_ID, register
from trace_gym.policies import make_tiny_model
from trace_gym.samplers import UniformSampler
from trace_gym.trainers import TreeGRPOConfig, TreeGRPOTrainer


def flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def main() -> None:
    torch.set_num_threads(1)
    register()
    model, tokenizer = make_tiny_model(seed=0)
    before = flat(model).clone()
    config = TreeGRPOConfig(
        output_dir=sys.argv[1], env_id=ENV_ID, env_kwargs={"num_tasks": 8}, max_steps=2, roots=4,
        continuations_per_root=0, max_per_prompt=4, candidates=4, max_completion_length=6,
        learning_rate=1e-2, logging_steps=1, save_strategy="no", report_to="none",
        gradient_checkpointing=False, per_device_train_batch_size=4, num_generations=2, seed=3,
        use_cpu=True, disable_tqdm=True,
    )  # fmt: skip
    trainer = TreeGRPOTrainer(model, config, UniformSampler(2), processing_class=tokenizer)
    trainer.train()
    after = flat(model)
    assert trainer.last_batch is not None
    report = {
        "rank": trainer.accelerator.process_index,
        "world": trainer.accelerator.num_processes,
        "rollout_seed": trainer.rollout_seed,
        "trees": [[n.completion_token_ids for n in t.nodes if n.generated] for t in trainer.last_batch.trees],
        "moved": float((after - before).abs().max()),
        "checksum": [float(after.sum()), float(after.norm())],
    }
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
