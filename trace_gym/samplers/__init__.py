"""Rollout-allocation strategies under one budget: uniform (GRPO), PCL, TreePO and TRACE."""

from trace_gym.samplers.base import Prediction, SampleBatch, Sampler
from trace_gym.samplers.pcl import PCLSampler
from trace_gym.samplers.trace import TraceSampler
from trace_gym.samplers.treepo import TreePOSampler
from trace_gym.samplers.uniform import UniformSampler

__all__ = [
    "PCLSampler",
    "Prediction",
    "SampleBatch",
    "Sampler",
    "TraceSampler",
    "TreePOSampler",
    "UniformSampler",
]
