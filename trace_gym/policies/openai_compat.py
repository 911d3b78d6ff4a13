"""OpenAIPolicy: any OpenAI-compatible chat-completions server (vLLM, SGLang, llama.cpp, OpenAI).

One chat-completions call per `GenerationRequest`, with `n` samples from the same prefix
(so a server with prefix caching, like vLLM, prefills the prefix once), sent concurrently
through a thread pool. Transient failures (connection errors, timeouts, HTTP 429 and 5xx)
are retried with exponential backoff; a request that still fails comes back as
`request.n` copies of `Generation.failure(...)` naming the URL, never as an exception, so
one dead request does not lose the batch.

Stop strings: OpenAI-compatible servers cut the matched stop string off the returned text.
Environments parse turns like ``<tool_call>...</tool_call>`` and need the closing tag, so when
a choice finished with ``finish_reason == "stop"`` and the server reports which stop string
matched (vLLM's ``stop_reason`` field), that string is appended back to the text. A server
that does not report it (the OpenAI API itself) leaves the text without the stop string.

Seeds: the server gets `engine_seed(request.seed)` (a 62-bit hash of it), not the seed
itself, because vLLM seeds sample j of an ``n > 1`` request with ``seed + j``: requests with
consecutive seeds would otherwise share samples.

Token ids: plain OpenAI responses carry none. With ``return_token_ids=True`` the policy asks a
vLLM server for them (the ``return_token_ids`` request field of recent vLLM versions, which
adds ``prompt_token_ids`` to the response and ``token_ids`` to each choice); fields the
server does not return stay ``None``. Logprobs of the sampled tokens come from
``choice.logprobs.content`` (``logprobs=True`` is always requested).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from trace_gym.errors import ConfigError, MissingDependencyError
from trace_gym.policies.vllm import engine_seed
from trace_gym.types import FinishReason, Generation, GenerationRequest

__all__ = ["OpenAIPolicy"]

_FINISH: dict[str, FinishReason] = {"stop": "stop", "tool_calls": "stop", "length": "length"}


def _import_openai() -> Any:
    try:
        import openai
    except ImportError as exc:
        raise MissingDependencyError("openai", "openai", "OpenAIPolicy") from exc
    return openai


def _tool_calls_as_text(tool_calls: Sequence[Any]) -> str:
    """Hermes-style text for tool calls a server parsed out of the content (tool_choice="auto")."""
    parts = []
    for call in tool_calls:
        fn = call.function
        try:
            arguments: Any = json.loads(fn.arguments)
        except (TypeError, ValueError):
            arguments = fn.arguments
        parts.append(
            "<tool_call>\n" + json.dumps({"name": fn.name, "arguments": arguments}) + "\n</tool_call>"
        )
    return "\n".join(parts)


class OpenAIPolicy:
    """Samples turns from an OpenAI-compatible chat-completions endpoint.

    Args:
        base_url: The server's API root, e.g. ``http://127.0.0.1:8000/v1``.
        model: The model name the server serves (see ``GET {base_url}/models``).
        api_key: Sent as the bearer token; local servers accept anything.
        max_concurrency: Requests in flight at once.
        timeout: Seconds one HTTP call may take before it counts as failed (and is retried).
        max_retries: Retries after the first attempt, on connection errors, timeouts, 429 and 5xx.
        backoff: Seconds before the first retry; doubles after each.
        tool_choice: Sent with requests that carry tools. The default ``"none"`` asks the
            server to render the tools into the prompt but return plain text, which the env
            parses itself (a vLLM server without ``--enable-auto-tool-choice`` rejects
            ``"auto"``). ``None`` omits the field. Tool calls a server does parse out are
            turned back into ``<tool_call>`` JSON text.
        return_token_ids: Ask the server (vLLM) for prompt and completion token ids.
        extra_body: Extra JSON fields merged into every request body (server-specific options).

    Raises:
        MissingDependencyError: When the ``openai`` package is not installed.
        ConfigError: On invalid arguments.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str = "EMPTY",
        max_concurrency: int = 8,
        timeout: float = 60.0,
        max_retries: int = 3,
        backoff: float = 0.5,
        tool_choice: str | None = "none",
        return_token_ids: bool = False,
        extra_body: Mapping[str, Any] | None = None,
    ) -> None:
        if max_concurrency < 1:
            raise ConfigError(f"max_concurrency must be >= 1, got {max_concurrency}.")
        if timeout <= 0:
            raise ConfigError(f"timeout must be > 0 seconds, got {timeout}.")
        if max_retries < 0:
            raise ConfigError(f"max_retries must be >= 0, got {max_retries}.")
        if backoff < 0:
            raise ConfigError(f"backoff must be >= 0 seconds, got {backoff}.")
        openai_mod = _import_openai()
        self.base_url = base_url
        self.model = model
        self.max_concurrency = max_concurrency
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff = backoff
        self.tool_choice = tool_choice
        self.return_token_ids = return_token_ids
        self.extra_body = dict(extra_body or {})
        self._openai = openai_mod
        # Retries are ours (with our backoff and error reporting), not the client's.
        self._client: Any = openai_mod.OpenAI(
            base_url=base_url, api_key=api_key, timeout=timeout, max_retries=0
        )

    def close(self) -> None:
        """Close the HTTP connection pool."""
        self._client.close()

    def __enter__(self) -> OpenAIPolicy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[Generation]]:
        """One list of exactly `request.n` generations per request, in order."""
        if not requests:
            return []
        workers = min(self.max_concurrency, len(requests))
        if workers == 1:
            return [self._generate_one(r) for r in requests]
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="openai-policy") as pool:
            return list(pool.map(self._generate_one, requests))

    def _body(self, request: GenerationRequest) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [dict(m) for m in request.messages],
            "n": request.n,
            "temperature": request.temperature,
            "top_p": request.top_p,
            "max_tokens": request.max_new_tokens,
            "logprobs": True,
        }
        if request.stop:
            body["stop"] = list(request.stop)
        if request.seed is not None:
            body["seed"] = engine_seed(request.seed)
        if request.tools:
            body["tools"] = [dict(t) for t in request.tools]
            if self.tool_choice is not None:
                body["tool_choice"] = self.tool_choice
        return body

    def _extra_body(self) -> dict[str, Any] | None:
        extra = dict(self.extra_body)
        if self.return_token_ids:
            extra.setdefault("return_token_ids", True)
        return extra or None

    def _generate_one(self, request: GenerationRequest) -> list[Generation]:
        try:
            response = self._call_with_retries(request)
        except _GaveUpError as exc:
            return [Generation.failure(str(exc))] * request.n
        try:
            return self._parse(request, response)
        except Exception as exc:  # a malformed response fails this request only
            msg = f"OpenAIPolicy: could not read the response from {self.base_url}: {exc!r}"
            return [Generation.failure(msg)] * request.n

    def _call_with_retries(self, request: GenerationRequest) -> Any:
        oa = self._openai
        transient = (oa.APIConnectionError, oa.InternalServerError, oa.RateLimitError)
        body = self._body(request)
        extra_body = self._extra_body()
        attempts = self.max_retries + 1
        last: BaseException | None = None
        for attempt in range(attempts):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                return self._client.chat.completions.create(**body, extra_body=extra_body)
            except transient as exc:
                last = exc
            except oa.APIStatusError as exc:  # 4xx: retrying will not help
                raise _GaveUpError(
                    f"OpenAIPolicy: {self.base_url} rejected the request (HTTP {exc.status_code}): "
                    f"{exc.message}. Check the model name {self.model!r} and the server's options."
                ) from exc
            except Exception as exc:
                raise _GaveUpError(f"OpenAIPolicy: request to {self.base_url} failed: {exc!r}") from exc
        kind = "timed out" if isinstance(last, oa.APITimeoutError) else "failed"
        raise _GaveUpError(
            f"OpenAIPolicy: request to {self.base_url} {kind} after {attempts} attempt(s): {last!r}. "
            f"Is the server running? Start it first, e.g. "
            f"`python -m vllm.entrypoints.openai.api_server --model {self.model}` "
            f"(or `vllm serve {self.model}`), and check that base_url ends in /v1."
        )

    def _parse(self, request: GenerationRequest, response: Any) -> list[Generation]:
        usage = getattr(response, "usage", None)
        prompt_tokens = int(getattr(usage, "prompt_tokens", 0) or 0)
        prompt_ids = _ids(_extra(response, "prompt_token_ids"))
        if prompt_ids is not None and not prompt_tokens:
            prompt_tokens = len(prompt_ids)
        choices = sorted(response.choices, key=lambda c: c.index)
        out: list[Generation] = []
        for choice in choices[: request.n]:
            message = choice.message
            text = message.content or ""
            tool_calls = getattr(message, "tool_calls", None)
            if tool_calls:
                text = (text + "\n" if text else "") + _tool_calls_as_text(tool_calls)
            finish = _FINISH.get(choice.finish_reason or "stop", "stop")
            stop_reason = _extra(choice, "stop_reason")
            if (
                finish == "stop"
                and isinstance(stop_reason, str)
                and stop_reason in request.stop
                and not text.endswith(stop_reason)
            ):
                text += stop_reason
            logprobs: tuple[float, ...] | None = None
            content = getattr(choice.logprobs, "content", None) if choice.logprobs is not None else None
            if content is not None:
                logprobs = tuple(float(t.logprob) for t in content)
            token_ids = _ids(_extra(choice, "token_ids"))
            if token_ids is None and content is not None:
                token_ids = _ids_from_tokens([t.token for t in content])
            completion_tokens = -1
            if token_ids is None:
                if logprobs is not None:
                    completion_tokens = len(logprobs)
                elif usage is not None and getattr(usage, "completion_tokens", None):
                    completion_tokens = round(usage.completion_tokens / max(len(choices), 1))
            out.append(
                Generation(
                    text=text,
                    finish_reason=finish,
                    prompt_tokens=prompt_tokens,
                    completion_token_ids=token_ids,
                    prompt_token_ids=prompt_ids,
                    logprobs=logprobs,
                    completion_tokens=completion_tokens,
                )
            )
        missing = request.n - len(out)
        if missing > 0:
            msg = f"OpenAIPolicy: {self.base_url} returned {len(out)} choices for n={request.n}."
            out.extend([Generation.failure(msg)] * missing)
        return out


class _GaveUpError(Exception):
    """A request failed for good; its message becomes the failed generations' error."""


def _extra(obj: Any, name: str) -> Any:
    """A field a server adds beyond the OpenAI schema (kept by the client's models as extras)."""
    value = getattr(obj, name, None)
    if value is None:
        extra = getattr(obj, "model_extra", None)
        if isinstance(extra, Mapping):
            value = extra.get(name)
    return value


def _ids(value: Any) -> tuple[int, ...] | None:
    if value is None:
        return None
    return tuple(int(v) for v in value)


def _ids_from_tokens(tokens: Sequence[str]) -> tuple[int, ...] | None:
    """Token ids from vLLM's ``return_tokens_as_token_ids`` form ``"token_id:123"``, else None."""
    ids = []
    for token in tokens:
        if not token.startswith("token_id:"):
            return None
        try:
            ids.append(int(token[len("token_id:") :]))
        except ValueError:
            return None
    return tuple(ids) if ids else None
