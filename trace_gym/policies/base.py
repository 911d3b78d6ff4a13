"""The `Policy` interface every generation backend implements (DESIGN section 5)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from trace_gym.types import Generation, GenerationRequest


@runtime_checkable
class Policy(Protocol):
    """Something that samples assistant turns.

    `generate` returns, for each request in order, a list of exactly `request.n`
    generations. A sample the backend cannot produce is returned as
    `Generation.failure(...)` rather than raised, so one bad request does not lose the
    batch; if `generate` raises anyway, the runner retries each request alone and
    records the ones that still fail as failed leaves.
    """

    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[Generation]]:
        """Sample `request.n` continuations of each request's messages."""
        ...
