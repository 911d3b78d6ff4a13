"""Rollout-allocation strategies under one budget."""

from trace_gym.samplers.base import SampleBatch, Sampler
from trace_gym.samplers.uniform import UniformSampler

__all__ = ["SampleBatch", "Sampler", "UniformSampler"]
