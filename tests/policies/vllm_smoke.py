"""Exercise `VLLMPolicy` on a tiny random model; run with the .venv-vllm interpreter.

    VLLM_CPU_KVCACHE_SPACE=2 .venv-vllm/bin/python tests/policies/vllm_smoke.py [MODEL_DIR]
    .venv-vllm/bin/python tests/policies/vllm_smoke.py --save MODEL_DIR   # only save the model

Prints one JSON object on the last line of stdout (the test in test_vllm.py reads it).
Without MODEL_DIR it builds the tiny model (`trace_gym.policies.tiny`) in a temp folder.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# Big enough for vLLM's CPU attention kernels (head size 64), small enough to be instant.
TINY_KWARGS: dict[str, Any] = {"hidden_size": 128, "heads": 2, "layers": 2, "max_position_embeddings": 2048}


def save_tiny_model(path: str | Path, seed: int = 0) -> Path:
    """Save the tiny random chat model and its tokenizer (with chat template) to `path`."""
    from trace_gym.policies.tiny import make_tiny_model

    model, tokenizer = make_tiny_model(seed=seed, **TINY_KWARGS)
    path = Path(path)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def _summary(gens: list[Any]) -> list[dict[str, Any]]:
    return [
        {
            "text": g.text,
            "finish_reason": g.finish_reason,
            "error": g.error,
            "prompt_tokens": g.prompt_tokens,
            "n_prompt_ids": len(g.prompt_token_ids or ()),
            "token_ids": list(g.completion_token_ids or ()),
            "logprobs": list(g.logprobs or ()),
        }
        for g in gens
    ]


def run(model_dir: Path) -> dict[str, Any]:
    """Run the checks and return their results as JSON-able data."""
    from trace_gym.policies.vllm import VLLMPolicy
    from trace_gym.types import GenerationRequest, message

    t0 = time.perf_counter()
    policy = VLLMPolicy(str(model_dir), max_model_len=1024, seed=0, dtype="float32", enforce_eager=True)
    startup_s = time.perf_counter() - t0
    tools = (
        {
            "type": "function",
            "function": {"name": "advance", "description": "Move.", "parameters": {"type": "object"}},
        },
    )
    msgs = (message("user", "What is the value after three steps?"),)
    # Stop strings that the random model will hit: frequent short tokens of the corpus.
    stop = ("e", "a", "</tool_call>")
    base = GenerationRequest(msgs, n=3, temperature=1.0, max_new_tokens=24, stop=stop, seed=7, tools=tools)
    greedy_long = GenerationRequest(msgs, n=1, temperature=0.0, max_new_tokens=8, seed=1)
    too_long = (message("user", "value " * 3000),)
    bad = GenerationRequest(too_long, n=2, max_new_tokens=8, seed=3)  # prompt > max_model_len
    out = policy.generate([base, greedy_long, bad])
    again = policy.generate([base])  # same seed, same samples
    other_seed = policy.generate(
        [GenerationRequest(msgs, n=3, max_new_tokens=24, stop=stop, seed=8, tools=tools)]
    )

    # throughput at batch 4 requests x 4 samples, no stop strings
    batch = [
        GenerationRequest(
            (message("user", f"Question {i}: what is the value?"),),
            n=4,
            max_new_tokens=64,
            seed=100 + i,
        )
        for i in range(4)
    ]
    policy.generate(batch)  # warm-up
    t0 = time.perf_counter()
    tp = policy.generate(batch)
    elapsed = time.perf_counter() - t0
    tokens = sum(g.completion_tokens for gens in tp for g in gens)

    # load_weights: new random weights change greedy output; the old ones restore it
    from trace_gym.policies.tiny import make_tiny_model

    load: dict[str, Any] = {}
    try:

        def greedy() -> dict[str, Any]:
            g = policy.generate([greedy_long])[0][0]
            return {"text": g.text, "logprobs": list(g.logprobs or ())}

        before = greedy()
        other, _ = make_tiny_model(seed=1, **TINY_KWARGS)
        policy.load_weights(other)
        changed = greedy()
        original, _ = make_tiny_model(seed=0, **TINY_KWARGS)
        policy.load_weights(original.state_dict())
        restored = greedy()
        load = {"ok": True, "before": before, "changed": changed, "restored": restored}
    except Exception as exc:
        load = {"ok": False, "error": repr(exc)}
    t0 = time.perf_counter()
    policy.close()
    close_s = time.perf_counter() - t0

    return {
        "startup_s": startup_s,
        "close_s": close_s,
        "stop": list(stop),
        "base": _summary(out[0]),
        "greedy_long": _summary(out[1]),
        "bad": _summary(out[2]),
        "again": _summary(again[0]),
        "other_seed": _summary(other_seed[0]),
        "throughput": {"tokens": tokens, "seconds": elapsed, "tokens_per_s": tokens / elapsed},
        "load_weights": load,
    }


def main(argv: list[str]) -> None:
    """Entry point: run the checks and print the JSON result."""
    if len(argv) == 3 and argv[1] == "--save":
        save_tiny_model(argv[2])
        return
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # for load_weights' apply_model
    if len(argv) > 1:
        result = run(Path(argv[1]))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            result = run(save_tiny_model(Path(tmp) / "tiny"))
    print(json.dumps(result), flush=True)
    sys.stderr.flush()
    os._exit(0)  # do not wait on vLLM's background threads at interpreter exit


if __name__ == "__main__":
    main(sys.argv)
