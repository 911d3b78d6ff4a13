"""How often the embedded SmolLM2-135M-Instruct solves MathPython-v0's easy end in one turn.

Greedy, one turn of at most 64 new tokens per problem, batch 4, graded by the env's own
reward. Also counts how many solved turns used the `<answer>`/`\\boxed` format (the rest were
read through the env's answer phrases, "The answer is X" and friends).

Run: python benchmarks/math_smollm2.py [--problems 20] [--difficulty 0.0]
"""

from __future__ import annotations

import argparse
import time
import warnings

from trace_gym.envs.math_python import MathPythonEnv
from trace_gym.policies.hf import HFPolicy
from trace_gym.policies.smollm2 import load_smollm2
from trace_gym.types import GenerationRequest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", type=int, default=20)
    parser.add_argument("--difficulty", type=float, default=0.0)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    args = parser.parse_args()
    warnings.simplefilter("ignore", RuntimeWarning)
    model, tokenizer = load_smollm2()
    policy = HFPolicy(model, tokenizer, max_batch_size=4)
    env = MathPythonEnv(num_tasks=args.problems, difficulty=args.difficulty, seed=0, max_turns=1)
    solved = tagged = calls = 0
    start = time.perf_counter()
    for first in range(0, args.problems, 4):
        indices = range(first, min(first + 4, args.problems))
        requests = []
        for i in indices:
            env.reset(options={"index": i})
            requests.append(
                GenerationRequest(
                    tuple(env.transcript),
                    max_new_tokens=args.max_new_tokens,
                    temperature=0.0,
                    stop=env.stop_sequences,
                    tools=env.tools,
                    seed=i,
                )
            )
        for i, samples in zip(indices, policy.generate(requests), strict=True):
            text = samples[0].text
            env.reset(options={"index": i})
            _, reward, _, _, _ = env.step(text)
            solved += reward > 0
            tagged += reward > 0 and ("<answer>" in text or "\\boxed" in text)
            calls += "<tool_call>" in text
    env.close()
    print(f"problems {args.problems} at difficulty {args.difficulty}")
    print(f"solved   {solved} ({solved / args.problems:.0%}), {tagged} of them with <answer> or \\boxed")
    print(f"turns with a tool call  {calls}")
    print(f"{time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
