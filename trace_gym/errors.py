"""One exception hierarchy for trace-gym.

Every message says what was expected, what was given, and how to fix it. Only
programming errors in the caller raise; a failure inside a rollout (a tool, an
env step, one generation) is recorded on its node instead (DESIGN section 9).
"""

from __future__ import annotations


class TraceGymError(Exception):
    """Base class of every error trace-gym raises on purpose."""


class ConfigError(TraceGymError, ValueError):
    """A configuration value is invalid; raised at construction time."""


class BudgetError(ConfigError):
    """A `Budget` that cannot be spent as asked."""


class UnknownTaskError(TraceGymError, LookupError):
    """A task id or index that the env's task source does not have."""

    def __str__(self) -> str:  # LookupError would quote the message like a key
        return str(self.args[0]) if self.args else ""


class SnapshotError(TraceGymError):
    """A snapshot cannot be taken or restored, or a replay diverged from the recording."""


class WrapperStateError(SnapshotError):
    """A Gymnasium wrapper holds state that `trace_gym.snapshot` does not know how to capture."""


class MissingDependencyError(TraceGymError, ImportError):
    """An optional dependency is not installed; the message names the extra to install."""

    def __init__(self, package: str, extra: str, purpose: str, *, command: str | None = None) -> None:
        command = command or f"pip install 'trace-gym[{extra}]'"
        super().__init__(
            f"{purpose} needs the package {package!r}, which is not installed. Install it with: {command}"
        )


class ContractViolation(TraceGymError, AssertionError):  # noqa: N818 (reads as the event)
    """An env broke the branchable-env contract; raised by `check_branchable_env`.

    Attributes:
        property: The contract property that broke (e.g. "fidelity").
        step: The step (number of actions taken since reset) where it broke, if known.
    """

    def __init__(self, property: str, message: str, step: int | None = None) -> None:
        where = f" at step {step}" if step is not None else ""
        super().__init__(f"{property} broke{where}: {message}")
        self.property = property
        self.step = step
