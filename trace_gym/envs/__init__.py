"""The shipped environments."""

from trace_gym.envs.synthetic import SyntheticConfig, SyntheticTreeEnv

__all__ = ["SyntheticConfig", "SyntheticTreeEnv"]
