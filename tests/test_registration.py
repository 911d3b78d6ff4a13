"""Every registered env keeps the contract, documents itself and makes without an import."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import gymnasium
import pytest
from gymnasium.envs.registration import load_env_creator

import trace_gym
from trace_gym.testing import check_branchable_env

ENV_IDS = trace_gym.registered_env_ids()
SECTIONS = ("Observation", "Action", "Reward", "Episode end", "Version history")


def _env_class(env_id: str) -> Any:
    entry_point = gymnasium.spec(env_id).entry_point
    if callable(entry_point):
        return entry_point
    assert isinstance(entry_point, str), f"{env_id} has no entry point"
    return load_env_creator(entry_point)


def test_some_envs_are_registered() -> None:
    assert "trace_gym/SyntheticTree-v0" in ENV_IDS


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_registered_env_keeps_the_contract(env_id: str) -> None:
    report = check_branchable_env(gymnasium.make(env_id))
    assert report.restores > 0


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_registered_env_docstring_has_the_sections(env_id: str) -> None:
    doc = inspect.getdoc(_env_class(env_id)) or ""
    parts = re.split(r"^## (.+)$", doc, flags=re.MULTILINE)
    bodies = {title.strip(): body.strip() for title, body in zip(parts[1::2], parts[2::2], strict=True)}
    assert [s for s in SECTIONS if not bodies.get(s)] == [], f"{env_id} docstring:\n{doc}"


def test_make_with_module_prefix_works_without_a_prior_import(tmp_path: Path) -> None:
    code = (
        "import sys, gymnasium\n"
        "assert 'trace_gym' not in sys.modules, 'trace_gym was imported before make'\n"
        "env = gymnasium.make('trace_gym:trace_gym/SyntheticTree-v0')\n"
        "observation, info = env.reset(seed=0)\n"
        "print(type(env.unwrapped).__name__, info['task_id'], isinstance(observation, str))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    name, task_id, is_text = result.stdout.split()
    assert (name, is_text) == ("SyntheticTreeEnv", "True")
    assert task_id.startswith("synthetic-")
