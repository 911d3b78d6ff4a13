"""Tests for trace_gym/types.py: tasks, messages, generation requests and results."""

from __future__ import annotations

import json
from typing import Any

import pytest

from trace_gym.errors import ConfigError, TraceGymError
from trace_gym.types import (
    Generation,
    GenerationRequest,
    Message,
    Task,
    as_messages,
    message,
)

CHAT: tuple[Message, ...] = (
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "2 + 2?"},
)


# ----- message ----------------------------------------------------------------------------
@pytest.mark.parametrize("role", ["system", "user", "assistant", "tool"])
def test_message_builds_a_plain_dict(role: Any) -> None:
    assert message(role, "hi") == {"role": role, "content": "hi"}


def test_message_bad_role_names_the_valid_roles_and_the_fix() -> None:
    with pytest.raises(
        ConfigError,
        match=(
            r"Message role must be one of \['assistant', 'system', 'tool', 'user'\], "
            r"got 'bot'\. Use 'tool' for tool results and 'user' for env feedback\."
        ),
    ):
        message("bot", "hi")  # type: ignore[arg-type]


def test_config_error_is_a_value_error_and_a_trace_gym_error() -> None:
    with pytest.raises(ValueError, match="got 'Assistant'"):
        message("Assistant", "hi")  # type: ignore[arg-type]
    assert issubclass(ConfigError, TraceGymError)


# ----- Task -------------------------------------------------------------------------------
def test_task_text_prompt_is_one_user_message() -> None:
    task = Task("t1", "What is 2 + 2?", answer="4")
    assert task.messages() == [{"role": "user", "content": "What is 2 + 2?"}]


def test_task_message_list_prompt_is_stored_as_a_tuple() -> None:
    task = Task("t1", list(CHAT))  # type: ignore[arg-type]
    assert isinstance(task.prompt, tuple)
    assert task.messages() == list(CHAT)


def test_task_messages_returns_a_fresh_list_each_call() -> None:
    task = Task("t1", CHAT)
    first = task.messages()
    first[0]["content"] = "changed"
    first.append({"role": "user", "content": "extra"})
    assert task.messages() == list(CHAT)
    assert task.prompt == CHAT


def test_task_messages_drop_keys_other_than_role_and_content() -> None:
    task = Task("t1", ({"role": "user", "content": "x", "name": "alice"},))  # type: ignore[typeddict-unknown-key]
    assert task.messages() == [{"role": "user", "content": "x"}]


@pytest.mark.parametrize("bad_id", ["", None, 7])
def test_task_id_must_be_a_non_empty_str(bad_id: Any) -> None:
    with pytest.raises(ConfigError, match=rf"Task\.id must be a non-empty str, got {bad_id!r}\."):
        Task(bad_id, "prompt")


@pytest.mark.parametrize(
    "bad",
    [
        {"role": "bot", "content": "x"},
        {"content": "x"},
        "user: hi",
        ("user", "hi"),
    ],
)
def test_task_prompt_messages_need_a_known_role(bad: Any) -> None:
    with pytest.raises(
        ConfigError,
        match=r"Task 't1': prompt messages must be dicts with a role in "
        r"\['assistant', 'system', 'tool', 'user'\] and a content str, got ",
    ):
        Task("t1", (CHAT[0], bad))


def test_task_prompt_messages_need_a_content_str() -> None:
    with pytest.raises(ConfigError, match="content str"):
        Task("t1", ({"role": "user"},))  # type: ignore[typeddict-item]


def test_task_is_frozen() -> None:
    task = Task("t1", "x")
    with pytest.raises(AttributeError):
        task.id = "t2"  # type: ignore[misc]


@pytest.mark.parametrize(
    "task",
    [
        Task("plain", "Add 2 and 2."),
        Task("chat", CHAT, answer={"value": 4, "unit": None}, metadata={"level": 3, "tags": ["a"]}),
        Task("unicode", "Σ über 日本 ✓", answer=["4", 4.0], metadata={"source": "gsm8k"}),
        Task("empty-chat", ()),
    ],
    ids=lambda t: t.id,
)
def test_task_dict_round_trip(task: Task) -> None:
    data = task.to_dict()
    again = Task.from_dict(json.loads(json.dumps(data)))
    assert again == task
    assert again.to_dict() == data
    assert again.messages() == task.messages()


def test_task_to_dict_shape() -> None:
    task = Task("chat", CHAT, answer="4", metadata={"k": 1})
    assert task.to_dict() == {
        "id": "chat",
        "prompt": [dict(m) for m in CHAT],
        "answer": "4",
        "metadata": {"k": 1},
    }


def test_task_to_dict_does_not_alias_the_task() -> None:
    task = Task("chat", CHAT, metadata={"k": 1})
    data = task.to_dict()
    data["prompt"][0]["content"] = "changed"
    data["metadata"]["k"] = 2
    assert task.prompt == CHAT
    assert task.metadata["k"] == 1


def test_task_from_dict_defaults_answer_and_metadata() -> None:
    task = Task.from_dict({"id": "t", "prompt": "hi"})
    assert task == Task("t", "hi")
    assert task.answer is None
    assert dict(task.metadata) == {}


def test_task_from_dict_checks_roles() -> None:
    with pytest.raises(ConfigError, match="Message role must be one of"):
        Task.from_dict({"id": "t", "prompt": [{"role": "robot", "content": "x"}]})


# ----- GenerationRequest --------------------------------------------------------------------
def test_generation_request_defaults() -> None:
    request = GenerationRequest(messages=CHAT)
    assert (request.n, request.temperature, request.top_p) == (1, 1.0, 1.0)
    assert (request.max_new_tokens, request.stop, request.seed, request.tools) == (512, (), None, ())


def test_generation_request_accepts_boundary_values() -> None:
    request = GenerationRequest(CHAT, n=1, temperature=0.0, top_p=1.0, max_new_tokens=1)
    assert request.temperature == 0.0


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"n": 0}, r"GenerationRequest\.n must be an int >= 1, got 0\."),
        ({"n": -3}, r"GenerationRequest\.n must be an int >= 1, got -3\."),
        ({"n": 2.5}, r"GenerationRequest\.n must be an int >= 1, got 2\.5\."),
        ({"temperature": -0.1}, r"temperature must be >= 0, got -0\.1\."),
        ({"top_p": 0.0}, r"top_p must be in \(0, 1\], got 0\.0\."),
        ({"top_p": 1.5}, r"top_p must be in \(0, 1\], got 1\.5\."),
        ({"max_new_tokens": 0}, r"max_new_tokens must be >= 1, got 0\."),
    ],
)
def test_generation_request_validation(kwargs: dict[str, Any], pattern: str) -> None:
    with pytest.raises(ConfigError, match=pattern):
        GenerationRequest(CHAT, **kwargs)


# ----- Generation -------------------------------------------------------------------------
def test_generation_failure() -> None:
    failed = Generation.failure("boom: backend timed out")
    assert failed.failed
    assert failed.text == ""
    assert failed.finish_reason == "error"
    assert failed.error == "boom: backend timed out"
    assert failed.completion_tokens == 0
    assert failed.completion_token_ids is None
    assert failed.logprobs is None


@pytest.mark.parametrize("reason", ["stop", "length"])
def test_generation_not_failed(reason: Any) -> None:
    generation = Generation("hello", reason)
    assert not generation.failed
    assert generation.error is None


def test_generation_completion_tokens_default_to_the_ids() -> None:
    assert Generation("ab", completion_token_ids=(5, 6, 7)).completion_tokens == 3
    assert Generation("ab").completion_tokens == 0
    assert Generation("ab", completion_token_ids=(5, 6, 7), completion_tokens=9).completion_tokens == 9


def test_as_messages_copies_into_plain_dicts() -> None:
    source = [{"role": "user", "content": "x", "extra": 1}]
    copied = as_messages(source)
    assert copied == ({"role": "user", "content": "x"},)
    source[0]["content"] = "changed"
    assert copied[0]["content"] == "x"
