"""Plain records shared by every part: tasks, chat messages, generation requests and results."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypedDict

from trace_gym.errors import ConfigError

Role = Literal["system", "user", "assistant", "tool"]
ROLES: frozenset[str] = frozenset({"system", "user", "assistant", "tool"})


class Message(TypedDict):
    """A chat message in the OpenAI / Hugging Face format, so chat templates apply unchanged."""

    role: str
    content: str


def message(role: Role, content: str) -> Message:
    """Build a `Message`, checking the role.

    >>> message("user", "hi")
    {'role': 'user', 'content': 'hi'}
    """
    if role not in ROLES:
        raise ConfigError(
            f"Message role must be one of {sorted(ROLES)}, got {role!r}. "
            "Use 'tool' for tool results and 'user' for env feedback."
        )
    return {"role": role, "content": content}


@dataclass(frozen=True)
class Task:
    """One problem an environment can pose.

    Attributes:
        id: Stable identifier, unique within its task source.
        prompt: The task as text (shown as one user message) or as chat messages.
        answer: What the verifier compares against; never shown to the policy.
        metadata: Anything else the env or a predictor may use (JSON-serialisable).
    """

    id: str
    prompt: str | tuple[Message, ...]
    answer: Any = None
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise ConfigError(f"Task.id must be a non-empty str, got {self.id!r}.")
        if not isinstance(self.prompt, str):
            prompt = tuple(self.prompt)
            for m in prompt:
                if (
                    not isinstance(m, Mapping)
                    or m.get("role") not in ROLES
                    or not isinstance(m.get("content"), str)
                ):
                    raise ConfigError(
                        f"Task {self.id!r}: prompt messages must be dicts with a role in "
                        f"{sorted(ROLES)} and a content str, got {m!r}."
                    )
            object.__setattr__(self, "prompt", prompt)

    def messages(self) -> list[Message]:
        """The prompt as a fresh list of chat messages."""
        if isinstance(self.prompt, str):
            return [message("user", self.prompt)]
        return [{"role": m["role"], "content": m["content"]} for m in self.prompt]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable form (inverse of `from_dict`)."""
        prompt: Any = self.prompt if isinstance(self.prompt, str) else [dict(m) for m in self.prompt]
        return {
            "id": self.id,
            "prompt": prompt,
            "answer": self.answer,
            "metadata": dict(self.metadata),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Task:
        """Rebuild a task from `to_dict` output."""
        prompt = data["prompt"]
        if not isinstance(prompt, str):
            prompt = tuple(message(m["role"], m["content"]) for m in prompt)
        return cls(data["id"], prompt, data.get("answer"), dict(data.get("metadata", {})))


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """Ask a policy for `n` samples continuing one conversation.

    Attributes:
        messages: The conversation so far (the env's transcript).
        n: Samples from this same prefix; backends share the prefix's prefill across them.
        temperature: Sampling temperature (0 means greedy).
        top_p: Nucleus sampling mass.
        max_new_tokens: Cap on generated tokens per sample.
        stop: Strings that end a turn (the env's `stop_sequences`).
        seed: Seed of this request; the same seed gives the same samples.
        tools: The env's tools as OpenAI function schemas, for the backend to render.
    """

    messages: tuple[Message, ...]
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 512
    stop: tuple[str, ...] = ()
    seed: int | None = None
    tools: tuple[Mapping[str, Any], ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.n, bool) or not isinstance(self.n, int) or self.n < 1:
            raise ConfigError(f"GenerationRequest.n must be an int >= 1, got {self.n!r}.")
        if self.temperature < 0:
            raise ConfigError(f"temperature must be >= 0, got {self.temperature}.")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}.")
        if self.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}.")


FinishReason = Literal["stop", "length", "error"]


@dataclass(frozen=True, slots=True)
class Generation:
    """One sampled assistant turn.

    Attributes:
        text: The generated text (empty when the generation failed).
        finish_reason: "stop" (stop sequence or EOS), "length" (token cap) or "error".
        prompt_tokens: Number of prompt tokens the sample conditioned on.
        completion_token_ids: The generated token ids, when the backend has them.
        prompt_token_ids: The prompt's token ids, when the backend has them.
        logprobs: Per-token log-probabilities of `completion_token_ids`, when available.
        completion_tokens: Number of generated tokens (defaults to len of the ids).
        error: Why the generation failed, when `finish_reason == "error"`.
    """

    text: str
    finish_reason: FinishReason = "stop"
    prompt_tokens: int = 0
    completion_token_ids: tuple[int, ...] | None = None
    prompt_token_ids: tuple[int, ...] | None = None
    logprobs: tuple[float, ...] | None = None
    completion_tokens: int = -1
    error: str | None = None

    def __post_init__(self) -> None:
        if self.completion_tokens < 0:
            n = len(self.completion_token_ids) if self.completion_token_ids is not None else 0
            object.__setattr__(self, "completion_tokens", n)

    @property
    def failed(self) -> bool:
        """Whether the backend could not produce this sample."""
        return self.finish_reason == "error"

    @classmethod
    def failure(cls, error: str) -> Generation:
        """A failed sample carrying its error message."""
        return cls(text="", finish_reason="error", error=error)


def as_messages(messages: Sequence[Mapping[str, Any]]) -> tuple[Message, ...]:
    """Copy a message list into a tuple of plain `Message` dicts."""
    return tuple({"role": m["role"], "content": m["content"]} for m in messages)
