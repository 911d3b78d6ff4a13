"""Fixtures shared by several test modules."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """Tiny matmuls run fastest on one thread, and the test machine's cores are shared.

    Use with `pytestmark = pytest.mark.usefixtures("one_torch_thread")`.
    """
    torch = pytest.importorskip("torch", reason="needs the hf extra: pip install 'trace-gym[hf]'")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
