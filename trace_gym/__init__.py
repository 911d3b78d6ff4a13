"""trace-gym: snapshot-restorable agentic environments and rollout-budget allocation.

Importing the package registers its envs with Gymnasium (`trace_gym/NAME-vN`).
"""

from trace_gym.budget import Budget, Ledger, StageCost
from trace_gym.env import (
    AnyText,
    BranchableEnv,
    Outcome,
    Snapshot,
    register_wrapper_state,
    restore,
    snapshot,
)
from trace_gym.errors import (
    BudgetError,
    ConfigError,
    ContractViolation,
    MissingDependencyError,
    SnapshotError,
    TraceGymError,
    UnknownTaskError,
    WrapperStateError,
)
from trace_gym.policies import Policy, SimulatedPolicy
from trace_gym.registration import register_envs, registered_env_ids
from trace_gym.rollout import Job, RolloutRunner, SamplingParams
from trace_gym.tree import Node, RolloutTree, read_jsonl, trees_to_rows, write_jsonl
from trace_gym.types import Generation, GenerationRequest, Message, Task, message

register_envs()

__version__ = "0.1.0"
__all__ = [
    "AnyText",
    "BranchableEnv",
    "Budget",
    "BudgetError",
    "ConfigError",
    "ContractViolation",
    "Generation",
    "GenerationRequest",
    "Job",
    "Ledger",
    "Message",
    "MissingDependencyError",
    "Node",
    "Outcome",
    "Policy",
    "RolloutRunner",
    "RolloutTree",
    "SamplingParams",
    "SimulatedPolicy",
    "Snapshot",
    "SnapshotError",
    "StageCost",
    "Task",
    "TraceGymError",
    "UnknownTaskError",
    "WrapperStateError",
    "message",
    "read_jsonl",
    "register_envs",
    "register_wrapper_state",
    "registered_env_ids",
    "restore",
    "snapshot",
    "trees_to_rows",
    "write_jsonl",
]
