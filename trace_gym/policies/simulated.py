"""SimulatedPolicy: the free policy that pairs with SyntheticTree-v0."""

from __future__ import annotations

import operator
from collections.abc import Sequence

from trace_gym.envs.synthetic import advance_call
from trace_gym.seeding import stream
from trace_gym.types import Generation, GenerationRequest

_content = operator.itemgetter("content")


def approx_tokens(text: str) -> int:
    """A token count estimate for simulated accounting: about four characters a token."""
    return len(text) // 4 + 1


class SimulatedPolicy:
    """Emits one `advance` call per turn with a uniform draw derived from the request seed.

    Sample j of a request with seed s draws u = (stream(s, j) mod 10^9) / 10^9, so the
    same seed gives the same samples whatever the batch looks like, and siblings of
    one request differ. Token counts are estimates (`approx_tokens`); there are no
    token ids or logprobs. A request without a seed raises: determinism is the point.
    """

    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[Generation]]:
        """One list of `request.n` generations per request."""
        out = []
        for request in requests:
            if request.seed is None:
                raise ValueError("SimulatedPolicy needs GenerationRequest.seed; the RolloutRunner sets it.")
            chars = sum(map(len, map(_content, request.messages)))
            prompt_tokens = chars // 4 + len(request.messages)
            samples = []
            for j in range(request.n):
                text = advance_call(stream(request.seed, j) % 10**9)
                samples.append(Generation(text, "stop", prompt_tokens, completion_tokens=approx_tokens(text)))
            out.append(samples)
        return out
