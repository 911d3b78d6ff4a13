"""Tools that envs give to policies: Python sandboxes, tool-call parsers.

Names are imported on first use, so `import trace_gym.tools` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trace_gym.tools.sandbox import CellResult as CellResult
    from trace_gym.tools.sandbox import DockerSandbox as DockerSandbox
    from trace_gym.tools.sandbox import ProcessSandbox as ProcessSandbox
    from trace_gym.tools.sandbox import PythonSandbox as PythonSandbox
    from trace_gym.tools.sandbox import SandboxError as SandboxError
    from trace_gym.tools.sandbox import SandboxState as SandboxState
    from trace_gym.tools.sandbox import detect_isolation as detect_isolation
    from trace_gym.tools.sandbox import make_sandbox as make_sandbox

_LAZY = {
    "CellResult": "trace_gym.tools.sandbox",
    "DockerSandbox": "trace_gym.tools.sandbox",
    "ProcessSandbox": "trace_gym.tools.sandbox",
    "PythonSandbox": "trace_gym.tools.sandbox",
    "SandboxError": "trace_gym.tools.sandbox",
    "SandboxState": "trace_gym.tools.sandbox",
    "detect_isolation": "trace_gym.tools.sandbox",
    "make_sandbox": "trace_gym.tools.sandbox",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'trace_gym.tools' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
