"""vaeshard: exact multi-GPU decode and encode for the VAEs of video and image diffusion models."""

from .config import MODES, VaeParallelConfig
from .api import parallelize, release_cuda_graphs, unparallelize
from .policy import Plan, plan

__version__ = "0.1.0"

__all__ = ["MODES", "Plan", "VaeParallelConfig", "parallelize", "plan", "release_cuda_graphs", "unparallelize", "__version__"]
