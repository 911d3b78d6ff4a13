"""HFPolicy: sampling with a transformers causal LM, one prefill per prefix.

The policy renders each request with the tokenizer's chat template (tools included),
runs one batched prefill over the distinct prompts of a chunk, expands each prompt's
KV cache across its `n` samples, and decodes all samples in lockstep with its own
small sampling loop. Owning the loop keeps three things exact that `model.generate`
makes awkward: a per-sample RNG (so a sample depends on its request's seed and index
only, never on the batch around it), stop strings cut right after the stop string, and
per-token log-probabilities under the raw model distribution.
"""

from __future__ import annotations

import copy
import inspect
import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from trace_gym.errors import ConfigError, MissingDependencyError
from trace_gym.seeding import stream
from trace_gym.types import FinishReason, Generation, GenerationRequest, Message

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = ["HFPolicy"]

logger = logging.getLogger(__name__)

Overflow = Literal["truncate_left", "error"]
_INSTALL = "pip install 'trace-gym[hf]'"
_TOOL_PROBE = "trace_gym_tool_probe"


def _import_torch() -> Any:
    try:
        import torch
        import transformers  # noqa: F401 (checked here so the error names the extra)
    except ImportError as exc:
        raise MissingDependencyError(exc.name or "transformers", "hf", "HFPolicy") from exc
    return torch


def plain_text_tools(tools: Sequence[Mapping[str, Any]]) -> str:
    """The tool schemas as a system-message text, for chat templates without tool support.

    The wording and the Hermes call format follow Qwen2.5's template, so a model that
    learned tool use there reads the same instructions.
    """
    listing = "\n".join(json.dumps(dict(t)) for t in tools)
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        f"You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{listing}\n"
        "</tools>\n\nFor each function call, return a json object with function name and arguments within "
        '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, '
        '"arguments": <args-json-object>}\n</tool_call>'
    )


@dataclass(slots=True)
class _Sample:
    """One sequence being decoded: sample `j` of request `request`."""

    request: int
    j: int
    generator: torch.Generator
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    text: str = ""
    finish: FinishReason | None = None


class HFPolicy:
    """A `Policy` backed by a transformers causal LM (CPU by default, CUDA when available).

    Sampling: sample j of a request with seed s draws from its own `torch.Generator`
    seeded with `stream(s, j) mod 2**63`, one uniform per token (inverse CDF over the
    temperature-scaled, top-p-filtered distribution; temperature 0 is greedy argmax), so
    a request gives the same samples alone or inside any batch, and its n samples differ.
    A request without a seed uses seed 0.

    Logprobs: the raw model log-softmax at each sampled token (before temperature and
    top-p), what TRL's GRPO computes for the policy ratio. The EOS token, when sampled,
    is in `completion_token_ids` (with its logprob) but not in the text.

    Stopping: EOS, or a stop string in the decoded text; the text is cut right after
    the first stop string, which is kept (vLLM's `include_stop_str_in_output=True`), and
    `completion_token_ids` keeps every token generated up to that point. Both give
    finish_reason "stop"; `max_new_tokens` gives "length".

    Prefill sharing: requests are packed into chunks of at most `max_batch_size`
    sequences. Each chunk runs one left-padded forward over its requests' prompts (one
    row per request, not per sample), then the KV cache rows are repeated across each
    request's n samples (`Cache.batch_select_indices`) and decoding starts from the
    prompt's last logits. `prefill_tokens` counts the prompt tokens run through a
    prefill (padding excluded): a request adds len(prompt ids) once, whatever its n.

    Context overflow (prompt + max_new_tokens > `context_window`): "truncate_left"
    drops the oldest non-system messages (and, if still too long, the oldest tokens),
    logs a warning and lists the request in `last_truncated`; "error" returns failed
    generations for that request only.

    Args:
        model: A causal LM; moved to `device` (and `dtype`) and put in eval mode.
        tokenizer: Its tokenizer, with a chat template.
        device: "cpu", "cuda", ...; None picks CUDA when available, else CPU.
        dtype: A torch dtype to cast the model to; None keeps its dtype.
        max_batch_size: Most sequences decoded at once (and prompts prefilled at once).
        context_window: Tokens the model may see; None reads `max_position_embeddings`.
        overflow: What to do with a prompt that does not fit, see above.
        seed: Base seed mixed into requests that carry none.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        device: str | torch.device | None = None,
        dtype: torch.dtype | None = None,
        max_batch_size: int = 16,
        context_window: int | None = None,
        overflow: Overflow = "truncate_left",
        seed: int = 0,
    ) -> None:
        torch = _import_torch()
        if max_batch_size < 1:
            raise ConfigError(f"max_batch_size must be >= 1, got {max_batch_size}.")
        if overflow not in ("truncate_left", "error"):
            raise ConfigError(f"overflow must be 'truncate_left' or 'error', got {overflow!r}.")
        if getattr(tokenizer, "chat_template", None) is None:
            raise ConfigError(
                f"The tokenizer {type(tokenizer).__name__} has no chat template, so HFPolicy cannot render "
                "a conversation. Use an instruct model's tokenizer or set tokenizer.chat_template."
            )
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        self.model = model.to(self.device) if dtype is None else model.to(self.device, dtype=dtype)
        self.model.eval()
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.overflow: Overflow = overflow
        self.seed = seed
        if context_window is None:
            context_window = getattr(model.config, "max_position_embeddings", None)
        self.context_window: int | None = context_window
        self.eos_token_ids = _eos_ids(model, tokenizer)
        pad = tokenizer.pad_token_id
        self.pad_token_id: int = int(pad if pad is not None else min(self.eos_token_ids, default=0))
        params = inspect.signature(model.forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"
        self._keep_arg = next((k for k in ("logits_to_keep", "num_logits_to_keep") if k in params), None)
        self.supports_tools = self._template_renders_tools()
        self.prefill_tokens = 0
        """Prompt tokens run through a prefill so far (padding excluded)."""
        self.last_truncated: list[int] = []
        """Indices (into the last `generate` call's requests) whose prompts were truncated."""

    @classmethod
    def from_pretrained(
        cls,
        path_or_id: str | os.PathLike[str],
        *,
        dtype: torch.dtype | None = None,
        **kwargs: Any,
    ) -> HFPolicy:
        """Load a model and tokenizer from a local directory or the local hub cache (no download).

        Args:
            path_or_id: A directory with a saved model, or a hub id already in the cache.
            dtype: Passed to the model loader (and to the policy).
            **kwargs: The other `HFPolicy` arguments.

        Raises:
            MissingDependencyError: transformers or torch is not installed.
            ConfigError: the model is not found locally.
        """
        _import_torch()
        from transformers import AutoModelForCausalLM, AutoTokenizer

        name = os.fspath(path_or_id)
        looks_local = name.startswith((".", "/", "~")) or name.count("/") > 1  # a hub id is "org/name"
        if looks_local and not os.path.isdir(os.path.expanduser(name)):
            raise ConfigError(
                f"No model directory at {name!r}. Pass a directory made by save_pretrained, "
                "or a hub id (org/name) already in the local cache."
            )
        name = os.path.expanduser(name)
        try:
            tokenizer = AutoTokenizer.from_pretrained(name, local_files_only=True)
            load_kw: dict[str, Any] = {"local_files_only": True}
            if dtype is not None:
                load_kw["dtype"] = dtype
            model = AutoModelForCausalLM.from_pretrained(name, **load_kw)
        except OSError as exc:
            raise ConfigError(
                f"Could not load {name!r} with local_files_only=True (HFPolicy never downloads): {exc}. "
                f"Download it first (`huggingface-cli download {name}`) or pass a local directory."
            ) from exc
        return cls(model, tokenizer, dtype=dtype, **kwargs)

    # ----- rendering ------------------------------------------------------------------
    def _template_renders_tools(self) -> bool:
        tool = {"type": "function", "function": {"name": _TOOL_PROBE, "parameters": {"type": "object"}}}
        try:
            text = self._apply([{"role": "user", "content": "hi"}], [tool])
        except Exception:  # a template that rejects the tools argument: use the fallback
            return False
        return _TOOL_PROBE in text

    def _apply(self, messages: Sequence[Message], tools: list[Mapping[str, Any]] | None) -> str:
        tokenizer: Any = self.tokenizer  # its annotations want dict[str, str] messages
        text = tokenizer.apply_chat_template(
            [dict(m) for m in messages], tools=tools, add_generation_prompt=True, tokenize=False
        )
        if not isinstance(text, str):
            raise ConfigError(f"apply_chat_template(tokenize=False) returned {type(text).__name__}, not str.")
        return text

    def render(self, messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] = ()) -> str:
        """The prompt text for `messages`, with `tools` rendered by the template or as a system message."""
        if not tools:
            return self._apply(messages, None)
        if self.supports_tools:
            return self._apply(messages, [dict(t) for t in tools])
        block = plain_text_tools(tools)
        if messages and messages[0]["role"] == "system":
            first: Message = {"role": "system", "content": f"{messages[0]['content']}\n\n{block}"}
            return self._apply([first, *messages[1:]], None)
        return self._apply([{"role": "system", "content": block}, *messages], None)

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def prompt_ids(self, request: GenerationRequest) -> tuple[list[int], bool]:
        """The request's prompt token ids, fitted to the context window, and whether it was truncated.

        Raises:
            ConfigError: the prompt does not fit and `overflow == "error"` (or nothing fits).
        """
        ids = self._encode(self.render(request.messages, request.tools))
        if not ids:
            raise ConfigError("the chat template rendered an empty prompt; check tokenizer.chat_template.")
        if self.context_window is None:
            return ids, False
        budget = self.context_window - request.max_new_tokens
        if len(ids) <= budget:
            return ids, False
        if self.overflow == "error" or budget < 1:
            raise ConfigError(
                f"prompt of {len(ids)} tokens exceeds the context window of {self.context_window} with "
                f"max_new_tokens={request.max_new_tokens}; lower max_new_tokens, shorten the episode "
                "(max_turns), or use overflow='truncate_left'."
            )
        messages = list(request.messages)
        keep = next((i for i, m in enumerate(messages) if m["role"] != "system"), len(messages))
        while len(ids) > budget and len(messages) - keep > 1:
            del messages[keep]  # the oldest non-system message
            ids = self._encode(self.render(messages, request.tools))
        return ids[-budget:], True

    # ----- generation -----------------------------------------------------------------
    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[Generation]]:
        """Sample `request.n` continuations of each request (see the class docstring)."""
        torch = _import_torch()
        self.last_truncated = []
        out: list[list[Generation]] = [[] for _ in requests]
        prompts: dict[int, list[int]] = {}
        for i, request in enumerate(requests):
            try:
                ids, truncated = self.prompt_ids(request)
            except ConfigError as exc:
                out[i] = [Generation.failure(str(exc))] * request.n
                continue
            if truncated:
                self.last_truncated.append(i)
                logger.warning(
                    "Request %d: prompt truncated on the left to %d tokens to fit the context window of %s.",
                    i,
                    len(ids),
                    self.context_window,
                )
            prompts[i] = ids
        with torch.inference_mode():
            for chunk in self._chunks(list(prompts), requests):
                for i, samples in self._run_chunk(chunk, requests, prompts).items():
                    out[i] = samples
        return out

    def _chunks(self, order: list[int], requests: Sequence[GenerationRequest]) -> list[list[int]]:
        """Pack requests, in order, into chunks of at most `max_batch_size` samples (a bigger n alone)."""
        chunks: list[list[int]] = []
        size = 0
        for i in order:
            n = requests[i].n
            if not chunks or size + n > self.max_batch_size:
                chunks.append([])
                size = 0
            chunks[-1].append(i)
            size += n
        return chunks

    def _forward(
        self, input_ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache: Any
    ) -> Any:
        kwargs: dict[str, Any] = {
            "input_ids": input_ids,
            "attention_mask": mask,
            "position_ids": positions,
            "use_cache": True,
            self._cache_arg: cache,
        }
        if self._keep_arg is not None:
            kwargs[self._keep_arg] = 1
        out = self.model(**kwargs)
        return out.logits[:, -1, :].float(), getattr(out, self._cache_arg)

    def _run_chunk(
        self, chunk: list[int], requests: Sequence[GenerationRequest], prompts: dict[int, list[int]]
    ) -> dict[int, list[Generation]]:
        """Prefill the chunk's prompts once, then decode every sample of its requests."""
        torch = _import_torch()
        width = max(len(prompts[i]) for i in chunk)
        ids = torch.full((len(chunk), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for row, i in enumerate(chunk):
            ids[row, width - len(prompts[i]) :] = torch.tensor(prompts[i])
            mask[row, width - len(prompts[i]) :] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        logits, cache = self._forward(
            ids.to(self.device), mask.to(self.device), positions.to(self.device), None
        )
        self.prefill_tokens += sum(len(prompts[i]) for i in chunk)

        samples = []
        rows = []
        for row, i in enumerate(chunk):
            request = requests[i]
            seed = request.seed if request.seed is not None else self.seed
            for j in range(request.n):
                generator = torch.Generator().manual_seed(stream(seed, j) % 2**63)
                samples.append(_Sample(i, j, generator))
                rows.append(row)
        for start in range(0, len(samples), self.max_batch_size):
            part = samples[start : start + self.max_batch_size]
            index = torch.tensor(rows[start : start + self.max_batch_size], device=self.device)
            last = start + self.max_batch_size >= len(samples)
            part_cache = cache if last else copy.deepcopy(cache)
            part_cache.batch_select_indices(index)
            self._decode(part, requests, prompts, logits[index], mask.to(self.device)[index], part_cache)

        results: dict[int, list[Generation]] = {i: [] for i in chunk}
        for s in samples:
            assert s.finish is not None
            prompt = prompts[s.request]
            results[s.request].append(
                Generation(
                    s.text,
                    s.finish,
                    len(prompt),
                    completion_token_ids=tuple(s.tokens),
                    prompt_token_ids=tuple(prompt),
                    logprobs=tuple(s.logprobs),
                )
            )
        return results

    def _decode(
        self,
        live: list[_Sample],
        requests: Sequence[GenerationRequest],
        prompts: dict[int, list[int]],
        logits: torch.Tensor,
        mask: torch.Tensor,
        cache: Any,
    ) -> None:
        """Decode `live` in lockstep until each stops; finished rows leave the batch."""
        torch = _import_torch()
        positions = torch.tensor([len(prompts[s.request]) for s in live], device=self.device)
        while True:
            logp = torch.log_softmax(logits, dim=-1).cpu()
            scaled = logits.cpu()
            tokens = []
            for row, s in enumerate(live):
                request = requests[s.request]
                token = _choose(scaled[row], request.temperature, request.top_p, s.generator)
                s.tokens.append(token)
                s.logprobs.append(float(logp[row, token]))
                self._check_stop(s, request, token)
                tokens.append(token)
            keep = [row for row, s in enumerate(live) if s.finish is None]
            if not keep:
                return
            if len(keep) < len(live):
                index = torch.tensor(keep, device=self.device)
                cache.batch_select_indices(index)
                mask, positions = mask[index], positions[index]
                live = [live[row] for row in keep]
                tokens = [tokens[row] for row in keep]
            mask = torch.cat([mask, mask.new_ones((len(live), 1))], dim=1)
            step = torch.tensor(tokens, device=self.device)[:, None]
            logits, cache = self._forward(step, mask, positions[:, None], cache)
            positions = positions + 1

    def _text(self, tokens: list[int]) -> str:
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        assert isinstance(text, str)
        return text

    def _check_stop(self, s: _Sample, request: GenerationRequest, token: int) -> None:
        """Set the sample's text and, when it ends here, its finish reason."""
        if token in self.eos_token_ids:
            s.text = self._text(s.tokens[:-1])
            s.finish = "stop"
            return
        s.text = self._text(s.tokens)
        cuts = [k + len(stop) for stop in request.stop if stop and (k := s.text.find(stop)) >= 0]
        if cuts:
            s.text = s.text[: min(cuts)]
            s.finish = "stop"
        elif len(s.tokens) >= request.max_new_tokens:
            s.finish = "length"


def _choose(logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator) -> int:
    """Greedy at temperature 0; else one uniform from `generator`, inverted through the CDF.

    The CDF runs over tokens sorted by probability (descending) and keeps the smallest
    prefix whose mass reaches `top_p` (always at least one token).
    """
    import torch

    if temperature == 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits / temperature, dim=-1)
    sorted_probs, order = torch.sort(probs, descending=True)
    cdf = torch.cumsum(sorted_probs, dim=-1)
    if top_p < 1.0:
        cut = int(torch.searchsorted(cdf, torch.tensor(top_p))) + 1
        cdf = cdf[:cut]
    u = torch.rand((), generator=generator) * cdf[-1]
    k = min(int(torch.searchsorted(cdf, u, right=True)), len(cdf) - 1)
    return int(order[k])


def _eos_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    ids: set[int] = set()
    config = getattr(model, "generation_config", None)
    for source in (getattr(config, "eos_token_id", None), tokenizer.eos_token_id):
        if isinstance(source, int):
            ids.add(source)
        elif source is not None:
            ids.update(int(x) for x in source)
    return frozenset(ids)
