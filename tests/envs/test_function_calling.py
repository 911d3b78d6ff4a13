"""FunctionCalling-v0 on BFCL's real data, API classes and checker (bfcl-eval installed)."""

from __future__ import annotations

import ast
import copy
import importlib
import json
import pickle
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium
import numpy as np
import pytest

pytest.importorskip("bfcl_eval", reason="needs bfcl-eval: pip install --no-deps bfcl-eval filelock mpmath")

from trace_gym.envs import _bfcl, function_calling
from trace_gym.envs.function_calling import (
    CATEGORIES,
    END_MESSAGE,
    FunctionCallingEnv,
    ground_truth_actions,
    hermes_call,
)
from trace_gym.errors import ConfigError, MissingDependencyError, UnknownTaskError
from trace_gym.testing import check_branchable_env
from trace_gym.types import Task

ENV_ID = "trace_gym/FunctionCalling-v0"
JSON_SCHEMA_TYPES = {"string", "integer", "number", "boolean", "array", "object", "null"}


@pytest.fixture(scope="module")
def registered() -> Iterator[str]:
    added = ENV_ID not in gymnasium.registry
    if added:
        gymnasium.register(ENV_ID, entry_point="trace_gym.envs.function_calling:FunctionCallingEnv")
    yield ENV_ID
    if added:
        del gymnasium.registry[ENV_ID]


@pytest.fixture(scope="module")
def env() -> FunctionCallingEnv:
    return FunctionCallingEnv()


def play(env: FunctionCallingEnv, task_id: str, actions: list[str]) -> tuple[float, bool, dict[str, Any]]:
    env.reset(options={"task_id": task_id})
    reward, done = 0.0, False
    info: dict[str, Any] = {}
    for action in actions:
        _, reward_, terminated, truncated, info = env.step(action)
        reward = float(reward_)
        done = terminated or truncated
        if done:
            break
    return reward, done, info


def bfcl_globals() -> set[str]:
    return {k for k in vars(sys.modules[_bfcl._UTILS]) if k.endswith("_instance")}


# ----- the contract ---------------------------------------------------------------------
def test_keeps_the_branchable_contract_through_gymnasium_make(registered: str) -> None:
    env = gymnasium.make(registered)
    report = check_branchable_env(env, seeds=(0, 1, 2, 3), episode_actions=16)
    assert max(report.episode_lengths.values()) >= 10
    assert report.restores > 100


def test_contract_kit_reaches_the_checker_verdict(env: FunctionCallingEnv) -> None:
    """example_action replays the ground truth, so a scripted episode ends with success."""
    env.reset(options={"task_id": "multi_turn_miss_func_0"})
    rng = np.random.default_rng(0)
    for _ in range(60):
        _, reward, terminated, truncated, info = env.step(env.example_action(rng))
        if terminated or truncated:
            break
    assert terminated
    assert info["success"] is (reward == 1.0)


# ----- tasks and bad input ----------------------------------------------------------------
def test_tasks_are_the_800_entries_selectable_by_category(env: FunctionCallingEnv) -> None:
    assert len(env.tasks) == 800
    counts = {c: sum(t.metadata["category"] == c for t in env.tasks) for c in CATEGORIES}
    assert counts == dict.fromkeys(CATEGORIES, 200)
    only = FunctionCallingEnv(categories=["miss_func", "base"])
    assert len(only.tasks) == 400
    assert only.task_ids[0] == "multi_turn_miss_func_0"
    assert {t.metadata["category"] for t in only.tasks} == {"miss_func", "base"}
    assert FunctionCallingEnv(categories="long_context").task_ids[-1] == "multi_turn_long_context_199"


@pytest.mark.parametrize("categories", [["simple"], "multi_turn_base", [], ["base", "nope"]])
def test_unknown_category_lists_the_valid_ones(categories: Any) -> None:
    with pytest.raises(ConfigError, match=r"\['base', 'long_context', 'miss_func', 'miss_param'\]"):
        FunctionCallingEnv(categories=categories)


def test_unknown_task_id_lists_examples(env: FunctionCallingEnv) -> None:
    base_only = FunctionCallingEnv(categories="base")
    with pytest.raises(UnknownTaskError, match=r"'multi_turn_base_0', 'multi_turn_base_1'"):
        base_only.reset(options={"task_id": "multi_turn_miss_func_0"})
    with pytest.raises(UnknownTaskError, match="800 tasks"):
        env.reset(options={"task_id": "multi_turn_base_200"})
    with pytest.raises(ConfigError, match=r"not a BFCL multi-turn entry id.*'multi_turn_base_0'"):
        env.reset(options={"task": Task("my_task", "hello")})


def test_a_task_object_of_another_category_can_be_posed() -> None:
    base_only = FunctionCallingEnv(categories="base")
    task = FunctionCallingEnv(categories="miss_param").tasks[3]
    observation, info = base_only.reset(options={"task": task})
    assert info["task_id"] == "multi_turn_miss_param_3"
    assert observation == task.messages()[-1]["content"]


def test_missing_bfcl_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    caches = (_bfcl.load_category, _bfcl._index, function_calling._category_tasks)
    for cache in caches:
        cache.cache_clear()
    for name in list(sys.modules):
        if name == "bfcl_eval" or name.startswith("bfcl_eval."):
            monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "bfcl_eval", None)
    with pytest.raises(MissingDependencyError, match=re.escape("pip install --no-deps bfcl-eval==")):
        FunctionCallingEnv()
    monkeypatch.undo()
    for cache in caches:
        cache.cache_clear()
    assert len(FunctionCallingEnv(categories="base").tasks) == 200


# ----- episode structure ------------------------------------------------------------------
def test_episode_walks_the_user_turns_and_scores_with_bfcl(env: FunctionCallingEnv) -> None:
    entry = _bfcl.find_entry("multi_turn_base_0")
    assert entry is not None
    observation, info = env.reset(options={"task_id": entry.id})
    assert [m["role"] for m in env.transcript] == ["system", "user"]
    assert "<tool_call>" in env.transcript[0]["content"]
    assert observation == entry.turns[0][0]["content"]
    assert info["user_turns"] == len(entry.turns)
    actions = ground_truth_actions(entry.id)
    first = actions[0]
    before = env.transcript_length
    observation, reward, terminated, _, info = env.step(first)
    new = env.messages_since(before)
    assert [m["role"] for m in new] == ["assistant"] + ["tool"] * len(entry.ground_truth[0])
    assert info["tool_calls"] == len(entry.ground_truth[0]) and reward == 0.0 and not terminated
    observation, *_ = env.step("I moved the file.")
    assert observation == entry.turns[1][0]["content"]
    assert env.user_turn == 1
    for action in actions[2:]:
        observation, reward, terminated, truncated, info = env.step(action)
    assert terminated and not truncated
    assert (observation, reward, info["success"]) == (END_MESSAGE, 1.0, True)


def test_replies_only_fail_with_the_checker_explanation(env: FunctionCallingEnv) -> None:
    entry = _bfcl.find_entry("multi_turn_base_0")
    assert entry is not None
    reward, done, info = play(env, entry.id, ["I can't."] * len(entry.turns))
    assert done and reward == 0.0 and info["success"] is False
    assert info["error_type"] == "multi_turn:empty_turn_model_response"
    assert "turn 0" in info["error_message"]


def test_a_wrong_state_fails_with_the_state_difference(env: FunctionCallingEnv) -> None:
    entry = _bfcl.find_entry("multi_turn_base_0")
    assert entry is not None
    actions = ground_truth_actions(entry.id)
    actions[0] = actions[0].replace('"temp"', '"tmp"')
    reward, done, info = play(env, entry.id, actions)
    assert done and reward == 0.0
    assert info["error_type"] == "multi_turn:instance_state_mismatch"
    assert "GorillaFileSystem" in info["error_message"]
    assert "differences" in info["error_details"]["details"]


def test_errors_are_observations_and_the_turn_goes_on(env: FunctionCallingEnv) -> None:
    env.reset(options={"task_id": "multi_turn_base_0"})
    cases = {
        hermes_call("nope", {}): r"^Error: unknown function 'nope'; the functions are: .*\bcd\b",
        '<tool_call>{"name": "cd", "arguments": {"folder": "x"</tool_call>': r"^Error: .*not valid JSON",
        '<tool_call>{"arguments": {}}</tool_call>': r"^Error: .*no 'name'",
        hermes_call("cd", {"bad key": 1}): r"^Error: 'bad key' is not a valid argument name for cd",
        '<tool_call>{"name": "cd", "arguments": {"folder": NaN}}</tool_call>': r"non-finite number",
        hermes_call("cd", {"folder": 5}): r"^Error during execution: 'int' object has no attribute",
        hermes_call("cd", {"fold": "x"}): r"^Error during execution: .*unexpected keyword argument 'fold'",
        hermes_call("cd", {}): r"^Error during execution: .*missing 1 required positional argument",
        hermes_call("cd", {"folder": "nowhere"}): r"^\{\"error\": \"cd: 'nowhere': No such file or directory",
    }
    for action, pattern in cases.items():
        observation, reward, terminated, truncated, _ = env.step(action)
        assert re.search(pattern, observation), (action, observation)
        assert env.transcript[-1]["role"] == "tool"
        assert (reward, terminated, truncated) == (0.0, False, False)
    assert env.user_turn == 0
    observation, *_ = env.step(hermes_call("ls", {}) + hermes_call("nope", {}) + "<tool_call>{")
    roles = [m["role"] for m in env.transcript[-3:]]
    assert roles == ["tool", "tool", "tool"] and "document" in env.transcript[-3]["content"]


def test_calls_the_env_did_not_run_are_not_given_to_the_checker(env: FunctionCallingEnv) -> None:
    entry = _bfcl.find_entry("multi_turn_base_0")
    assert entry is not None
    actions = ground_truth_actions(entry.id)
    noise = hermes_call("nope", {"x": 1}) + hermes_call("cd", {"bad key": 1}) + "<tool_call>{"
    reward, _, info = play(env, entry.id, [noise, *actions])
    assert reward == 1.0
    assert all("nope" not in c and "bad key" not in c for t in info["decoded_calls"] for s in t for c in s)


def test_miss_func_reveals_the_held_out_functions_at_bfcls_turn(env: FunctionCallingEnv) -> None:
    entry = _bfcl.find_entry("multi_turn_miss_func_0")
    assert entry is not None and entry.revealed.keys() == {3}
    env.reset(options={"task_id": entry.id})
    names = [t["function"]["name"] for t in env.tools]
    assert "sort" not in names
    for _ in range(3):
        observation, *_ = env.step("Done.")
    assert env.user_turn == 3
    assert observation.startswith("I have updated some more functions you can choose from. What about now?")
    assert '"name": "sort"' in observation
    assert [t["function"]["name"] for t in env.tools] == [*names, "sort"]
    # The tools follow the turn position through snapshots.
    snap = env.snapshot()
    env.reset(options={"task_id": entry.id})
    assert "sort" not in [t["function"]["name"] for t in env.tools]
    env.restore(snap)
    assert [t["function"]["name"] for t in env.tools][-1] == "sort"


def test_tools_are_openai_schemas_of_the_involved_classes(env: FunctionCallingEnv) -> None:
    for task_id in ("multi_turn_base_0", "multi_turn_long_context_80", "multi_turn_miss_param_160"):
        env.reset(options={"task_id": task_id})
        entry = env.entry
        assert entry is not None
        expected = [d["name"] for c in entry.involved_classes for d in _bfcl.class_docs(c)]
        assert [t["function"]["name"] for t in env.tools] == expected
        for tool in env.tools:
            assert tool["type"] == "function" and set(tool["function"]) == {
                "name",
                "description",
                "parameters",
            }
            assert tool["function"]["parameters"]["type"] == "object"
            _assert_json_schema_types(tool["function"]["parameters"])


def test_tool_schemas_are_valid_json_schema(env: FunctionCallingEnv) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    seen = set()
    for task in env.tasks[::7]:
        env.reset(options={"task_id": task.id})
        for tool in env.tools:
            if tool["function"]["name"] not in seen:
                seen.add(tool["function"]["name"])
                jsonschema.Draft202012Validator.check_schema(tool["function"]["parameters"])
    assert len(seen) > 100


def _assert_json_schema_types(schema: Any) -> None:
    if isinstance(schema, dict):
        if "type" in schema and isinstance(schema["type"], str):
            assert schema["type"] in JSON_SCHEMA_TYPES, schema
        for key, value in schema.items():
            if key in ("properties",):
                for sub in value.values():
                    _assert_json_schema_types(sub)
            elif key == "items":
                _assert_json_schema_types(value)


def test_float_parameters_convert_as_bfcl_does() -> None:
    doc = next(d for d in _bfcl.class_docs("MathAPI") if d["name"] == "add")
    tool = _bfcl.openai_tool(doc)
    a = tool["function"]["parameters"]["properties"]["a"]
    assert a["type"] == "number" and a["format"] == "float"
    assert a["description"].endswith(" This is a float type value.")
    assert doc["parameters"]["properties"]["a"]["type"] == "float"  # BFCL's doc is not mutated


BFCL_CLASSES = (
    "GorillaFileSystem",
    "MathAPI",
    "MessageAPI",
    "TwitterAPI",
    "TicketAPI",
    "TradingBot",
    "TravelAPI",
    "VehicleControlAPI",
)


def test_openai_tools_equal_bfcls_own_convert_to_tool() -> None:
    """Oracle: BFCL's `convert_to_tool`, run from its source (its module needs tree-sitter)."""
    handler_pkg = importlib.import_module("bfcl_eval.model_handler")
    model_style = importlib.import_module("bfcl_eval.constants.enums").ModelStyle
    mapping = importlib.import_module("bfcl_eval.constants.type_mappings").GORILLA_TO_OPENAPI
    source = (Path(str(handler_pkg.__file__)).parent / "utils.py").read_text()
    names = ("_cast_to_openai_type", "convert_to_tool")
    wanted: list[ast.stmt] = [
        n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name in names
    ]
    assert len(wanted) == 2
    namespace: dict[str, Any] = {"copy": copy, "re": re, "json": json, "ModelStyle": model_style}
    namespace["GORILLA_TO_OPENAPI"] = mapping
    exec(compile(ast.Module(body=wanted, type_ignores=[]), "bfcl_utils", "exec"), namespace)
    for class_name in BFCL_CLASSES:
        docs = list(_bfcl.class_docs(class_name))
        theirs = namespace["convert_to_tool"](docs, mapping, model_style.OPENAI_COMPLETIONS)
        for doc, their in zip(docs, theirs, strict=True):
            their["function"].pop("response", None)
            assert _bfcl.openai_tool(doc) == their


def test_held_out_docs_match_bfcls_loader() -> None:
    """Oracle: BFCL's `load_dataset_entry` (function lists, held-out docs, hints)."""
    load_dataset_entry = importlib.import_module("bfcl_eval.utils").load_dataset_entry
    for category in CATEGORIES:
        theirs = load_dataset_entry(f"multi_turn_{category}")
        ours = _bfcl.load_category(category)
        assert [e["id"] for e in theirs] == [e.id for e in ours]
        for their, our in zip(theirs, ours, strict=True):
            assert list(our.docs) == their["function"]
            missed = {int(k): v for k, v in their.get("missed_function", {}).items()}
            assert {k: list(v) for k, v in our.revealed.items()} == missed
            assert [list(t) for t in our.turns] == their["question"]


# ----- instances: per episode, per branch ------------------------------------------------
def _ls(env: FunctionCallingEnv) -> str:
    observation, *_ = env.step(hermes_call("ls", {}))
    return observation


def test_envs_and_episodes_do_not_share_instances() -> None:
    first, second = FunctionCallingEnv("base"), FunctionCallingEnv("base")
    before = bfcl_globals()
    for e in (first, second):
        e.reset(options={"task_id": "multi_turn_base_0"})
    first.step(hermes_call("mkdir", {"dir_name": "made_here"}))
    assert "made_here" in _ls(first)
    assert "made_here" not in _ls(second)
    first.reset(options={"task_id": "multi_turn_base_0"})
    assert "made_here" not in _ls(first)
    play(first, "multi_turn_base_0", ground_truth_actions("multi_turn_base_0"))
    assert bfcl_globals() == before  # the checker's instances do not outlive the check


def test_the_same_entry_scores_the_same_every_time(env: FunctionCallingEnv) -> None:
    actions = ground_truth_actions("multi_turn_long_context_5")
    assert [play(env, "multi_turn_long_context_5", actions)[0] for _ in range(3)] == [1.0, 1.0, 1.0]
    bad = ["Done."] * len(actions)
    assert play(env, "multi_turn_long_context_5", bad)[0] == 0.0
    assert play(env, "multi_turn_long_context_5", actions)[0] == 1.0


def test_restore_brings_back_the_instances_and_branches_are_isolated() -> None:
    env, other = FunctionCallingEnv("base"), FunctionCallingEnv("base")
    env.reset(options={"task_id": "multi_turn_base_0"})
    env.step(hermes_call("cd", {"folder": "document"}))
    snap = env.snapshot()
    env.step(hermes_call("mkdir", {"dir_name": "branch_a"}))
    assert "branch_a" in _ls(env)
    other.restore(pickle.loads(pickle.dumps(snap)))
    assert "branch_a" not in _ls(other)
    other.step(hermes_call("mkdir", {"dir_name": "branch_b"}))
    env.restore(snap)
    listing = _ls(env)
    assert "branch_a" not in listing and "branch_b" not in listing and "final_report.pdf" in listing


def test_snapshots_reuse_the_pickles_of_unchanged_instances() -> None:
    env = FunctionCallingEnv("base")
    env.reset(options={"task_id": "multi_turn_base_0"})  # TwitterAPI and GorillaFileSystem
    first = dict(env.snapshot().state[-1][-1])
    env.step("<tool_call>{")  # nothing runs
    second = dict(env.snapshot().state[-1][-1])
    env.step(hermes_call("ls", {}))  # runs on GorillaFileSystem only
    third = dict(env.snapshot().state[-1][-1])
    assert all(first[k] is second[k] for k in first)
    assert third["TwitterAPI"] is first["TwitterAPI"]
    assert third["GorillaFileSystem"] is not first["GorillaFileSystem"]


# ----- limits ---------------------------------------------------------------------------
def test_step_limit_per_user_turn_force_terminates() -> None:
    env = FunctionCallingEnv("base", max_steps_per_turn=2)
    env.reset(options={"task_id": "multi_turn_base_0"})
    for _ in range(2):
        assert not env.step(hermes_call("pwd", {}))[2]
    env.step("ok")  # a reply resets the count for the next user turn
    for _ in range(2):
        env.step(hermes_call("pwd", {}))
    observation, reward, terminated, truncated, info = env.step(hermes_call("pwd", {}))
    assert (observation, reward, terminated, truncated) == (END_MESSAGE, 0.0, True, False)
    assert info["error_type"] == "multi_turn:force_terminated" and info["success"] is False


def test_turn_limit_truncates() -> None:
    env = FunctionCallingEnv("base", max_turns=3)
    env.reset(options={"task_id": "multi_turn_base_0"})
    outcomes = [env.step("<tool_call>{")[2:4] for _ in range(3)]
    assert outcomes == [(False, False), (False, False), (False, True)]


def test_bad_limits_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="max_steps_per_turn must be >= 1, got 0"):
        FunctionCallingEnv(max_steps_per_turn=0)
    with pytest.raises(ConfigError, match="max_turns must be >= 1"):
        FunctionCallingEnv(max_turns=0)


def test_ground_truth_calls_name_positional_arguments() -> None:
    entry = _bfcl.find_entry("multi_turn_miss_func_0")
    assert entry is not None
    assert _bfcl.ground_truth_call("sort('final_report.pdf')", entry) == (
        "sort",
        {"file_name": "final_report.pdf"},
    )
    assert ground_truth_actions(entry.id)[-2].count("<tool_call>") == len(entry.ground_truth[-1])


def test_episodes_scored_in_parallel_threads_get_their_own_verdicts() -> None:
    """The checker's instances live under a run name of their own, so threads do not mix."""
    from concurrent.futures import ThreadPoolExecutor

    ids = [f"multi_turn_{c}_{i}" for c in CATEGORIES for i in (2, 7, 11)]

    def score(job: tuple[str, bool]) -> float:
        task_id, faithful = job
        env = FunctionCallingEnv()
        actions = ground_truth_actions(task_id)
        if not faithful:
            actions = ["Done."] * sum(1 for a in actions if "<tool_call>" not in a)
        return play(env, task_id, actions)[0]

    jobs = [(task_id, faithful) for task_id in ids for faithful in (True, False)] * 2
    with ThreadPoolExecutor(max_workers=8) as pool:
        rewards = list(pool.map(score, jobs))
    assert rewards == [1.0 if faithful else 0.0 for _, faithful in jobs]
