"""vaeshard: exact multi-GPU decode and encode for the VAEs of video and image diffusion models."""

from .config import MODES, VaeParallelConfig
from .parallel import parallelize, unparallelize
from .policy import Plan, plan

__version__ = "0.1.0"

__all__ = ["MODES", "Plan", "VaeParallelConfig", "parallelize", "plan", "unparallelize", "__version__"]
