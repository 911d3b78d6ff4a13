"""Generation backends behind the `Policy` interface."""

from trace_gym.policies.base import Policy
from trace_gym.policies.simulated import SimulatedPolicy

__all__ = ["Policy", "SimulatedPolicy"]
