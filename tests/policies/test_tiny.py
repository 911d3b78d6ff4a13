import json
import sys
import time
from typing import Any

import pytest

from trace_gym.errors import ConfigError, MissingDependencyError
from trace_gym.policies import make_tiny_model  # lazy: importing needs no transformers
from trace_gym.policies.tiny import TOOL_TOKENS

pytest.importorskip("transformers", reason="needs the hf extra: pip install 'trace-gym[hf]'")
pytest.importorskip("tokenizers", reason="needs the hf extra: pip install 'trace-gym[hf]'")

TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "advance",
            "description": "Take one step.",
            "parameters": {"type": "object", "properties": {"draw": {"type": "number"}}},
        },
    }
]


def test_builds_offline_in_under_a_second_after_the_first_call():
    make_tiny_model()
    start = time.perf_counter()
    model, tokenizer = make_tiny_model(seed=3)
    assert time.perf_counter() - start < 1.0
    assert model.config.vocab_size >= len(tokenizer)
    assert not model.training


def test_same_seed_same_weights_and_global_rng_untouched():
    import torch

    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    a, _ = make_tiny_model(seed=1)
    assert torch.equal(torch.rand(3), expected)
    b, _ = make_tiny_model(seed=1)
    c, _ = make_tiny_model(seed=2)
    wa, wb, wc = (m.state_dict()["model.embed_tokens.weight"] for m in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)


def test_callers_get_their_own_tokenizer():
    _, first = make_tiny_model()
    first.add_tokens(["<mine>"])
    first.chat_template = "changed"
    _, second = make_tiny_model()
    assert "<mine>" not in second.get_vocab()
    assert second.chat_template != "changed"


def test_chat_template_renders_tools_and_generation_prompt():
    _, tokenizer = make_tiny_model()
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Go."},
        {"role": "assistant", "content": '<tool_call>{"name": "advance"}</tool_call>'},
        {"role": "tool", "content": "value 3"},
    ]
    text = tokenizer.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, tokenize=False)
    assert isinstance(text, str)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools")
    assert json.dumps(TOOLS[0]) in text
    assert text.count("<|im_start|>system") == 1
    assert "<|im_start|>user\n<tool_response>\nvalue 3\n</tool_response><|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\n")
    bare = tokenizer.apply_chat_template(messages[1:2], add_generation_prompt=False, tokenize=False)
    assert bare == "<|im_start|>user\nGo.<|im_end|>\n"


def test_control_and_tool_tokens_are_single_tokens():
    _, tokenizer = make_tiny_model()
    for token in ("<|im_start|>", "<|im_end|>", *TOOL_TOKENS):
        assert len(tokenizer.encode(token, add_special_tokens=False)) == 1, token
    text = '<tool_call>\n{"name": "advance", "arguments": {}}\n</tool_call>'
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids, skip_special_tokens=True) == text
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token_id != tokenizer.eos_token_id


def test_bad_sizes_are_refused():
    with pytest.raises(ConfigError, match="vocab_size must be >= 300"):
        make_tiny_model(vocab_size=100)
    with pytest.raises(ConfigError, match="divisible by heads"):
        make_tiny_model(hidden_size=30, heads=4)


def test_missing_transformers_is_reported_on_call_with_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers now raises
    with pytest.raises(MissingDependencyError, match=r"pip install 'trace-gym\[hf\]'"):
        make_tiny_model()
