"""A tiny random chat model for tests and examples: no hub, no download, well under a second.

`make_tiny_model` builds a random Qwen2-style causal LM and a byte-level BPE tokenizer
trained in-process on a small built-in corpus of chat and Hermes tool-call text. The
tokenizer carries a ChatML chat template that renders `tools` the way Qwen templates do
(a system block listing the schemas as JSON inside `<tools></tools>`), so `HFPolicy`
exercises the same code path on it as on a real instruct model.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from trace_gym.errors import ConfigError, MissingDependencyError

if TYPE_CHECKING:
    from tokenizers import Tokenizer
    from transformers import PreTrainedModel, PreTrainedTokenizerFast

__all__ = ["CHAT_TEMPLATE", "SPECIAL_TOKENS", "TOOL_TOKENS", "make_tiny_model"]

BOS, EOS, PAD, IM_START = "<|endoftext|>", "<|im_end|>", "<|pad|>", "<|im_start|>"
SPECIAL_TOKENS: tuple[str, ...] = (BOS, PAD, IM_START, EOS)
"""Control tokens, in id order from 0; `decode(..., skip_special_tokens=True)` drops them."""

TOOL_TOKENS: tuple[str, ...] = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
"""Single tokens that stay in decoded text, as in Qwen2.5's vocabulary."""

CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages and messages[0].role == 'system' %}{{- messages[0].content }}"
    "{%- else %}{{- 'You are a helpful assistant.' }}{%- endif %}"
    "{{- '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and "
    'arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, '
    '\\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n\' }}'
    "{%- elif messages and messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'tool' %}"
    "{%- if loop.first or loop.previtem.role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or loop.nextitem.role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- elif not (message.role == 'system' and loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
"""ChatML with Qwen2.5-style tool rendering; consecutive tool results share one user turn."""

_CORPUS = (
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n",
    "<|im_start|>user\nWhat is the value after three steps? Think, then answer.<|im_end|>\n",
    "<|im_start|>assistant\nI will call the tool first.\n<tool_call>\n"
    '{"name": "advance", "arguments": {"direction": "left"}}\n</tool_call><|im_end|>\n',
    '<|im_start|>user\n<tool_response>\n{"value": 3, "done": false}\n</tool_response><|im_end|>\n',
    "<|im_start|>assistant\nThe answer is <answer>42</answer><|im_end|>\n",
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n",
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n",
    '{"type": "function", "function": {"name": "search", "description": "Search the index.", '
    '"parameters": {"type": "object", "properties": {"query": {"type": "string"}}, '
    '"required": ["query"]}}}\n</tools>\n',
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags.\n",
    "Error: the action is malformed. Call a tool with <tool_call> or give a final <answer>.\n",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))  # 5\n",
    "The quick brown fox jumps over the lazy dog. 0 1 2 3 4 5 6 7 8 9 + - * / = ( ) [ ] { }\n",
)


def make_tiny_model(
    seed: int = 0,
    *,
    vocab_size: int = 512,
    hidden_size: int = 64,
    layers: int = 2,
    heads: int = 4,
    max_position_embeddings: int = 4096,
) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """A random Qwen2-style causal LM and its trained chat tokenizer, built offline.

    The weights come from `seed` alone (the global torch RNG is left as it was). The
    tokenizer is trained once per `vocab_size` and cached as its JSON; every call gets
    a fresh model and a fresh tokenizer object, so callers cannot mutate a shared one.

    Args:
        seed: Seed of the weight initialisation.
        vocab_size: Model vocabulary (>= 300: 256 bytes, the control and tool tokens, merges).
        hidden_size: Width of the residual stream; divisible by `heads`.
        layers: Number of decoder layers.
        heads: Attention heads (and key/value heads).
        max_position_embeddings: The model's context window.

    Returns:
        `(model, tokenizer)`, the model in eval mode on the CPU in float32.

    Raises:
        MissingDependencyError: transformers, tokenizers or torch is not installed.
        ConfigError: a size that cannot build a model.
    """
    if vocab_size < 300:
        raise ConfigError(
            f"vocab_size must be >= 300 (256 bytes + control tokens + merges), got {vocab_size}."
        )
    if hidden_size % heads or (hidden_size // heads) % 2:
        raise ConfigError(
            f"hidden_size ({hidden_size}) must be divisible by heads ({heads}) into an even head size."
        )
    try:
        import torch
        from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
    except ImportError as exc:
        raise MissingDependencyError("transformers", "hf", "make_tiny_model") from exc

    fast: Any = PreTrainedTokenizerFast  # its __init__ is untyped in transformers 5
    tokenizer = fast(
        tokenizer_object=_tokenizer_from_json(_trained_tokenizer_json(vocab_size)),
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        additional_special_tokens=[IM_START],
        padding_side="left",
        model_max_length=max_position_embeddings,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    ids = tokenizer.get_vocab()
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=max_position_embeddings,
        bos_token_id=ids[BOS],
        eos_token_id=ids[EOS],
        pad_token_id=ids[PAD],
        tie_word_embeddings=True,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model: Any = Qwen2ForCausalLM(config)
    model.eval()
    return model, tokenizer


def _tokenizer_from_json(data: str) -> Tokenizer:
    from tokenizers import Tokenizer

    return Tokenizer.from_str(data)


@functools.lru_cache(maxsize=8)
def _trained_tokenizer_json(vocab_size: int) -> str:
    """Train the byte-level BPE once per vocabulary size; the JSON string is immutable."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(TOOL_TOKENS),
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_TOKENS])
    return tok.to_str()
