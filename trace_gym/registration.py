"""Registers every shipped env with Gymnasium under the `trace_gym/` namespace."""

from __future__ import annotations

import gymnasium

ENVS: dict[str, str] = {
    "trace_gym/SyntheticTree-v0": "trace_gym.envs.synthetic:SyntheticTreeEnv",
    "trace_gym/MathPython-v0": "trace_gym.envs.math_python:MathPythonEnv",
    "trace_gym/FunctionCalling-v0": "trace_gym.envs.function_calling:FunctionCallingEnv",
}


def register_envs() -> None:
    """Register the shipped envs (idempotent)."""
    for env_id, entry_point in ENVS.items():
        if env_id not in gymnasium.registry:
            gymnasium.register(env_id, entry_point=entry_point)


def registered_env_ids() -> list[str]:
    """Every env id registered under `trace_gym/` (shipped ones and any added later)."""
    return sorted(i for i in gymnasium.registry if i.startswith("trace_gym/"))
