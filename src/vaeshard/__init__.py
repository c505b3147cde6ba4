"""vaeshard: exact multi-GPU decode and encode for the VAEs of video and image diffusion models.

vae = vaeshard.parallelize(vae)          # every rank of the default process group
video = vae.decode(latents).sample       # the same call as before, spread over the ranks
for chunk in vaeshard.stream_decode(vae, latents):  # or its frames, as the decoder makes them
    ...
"""

from .api import INPUT_DTYPES, abort, check, parallelize, release, unparallelize, verify_weights
from .config import MODES, FastOptions
from .families import ShapeFacts, cast_as_loaded, named_configs, shape_facts, supported_classes
from .policy import Plan, plan
from .runtime.comm import CommTimeout
from .stream import DecodeStream, StreamClosed, stream_decode

__version__ = "0.2.0"

__all__ = [
    "INPUT_DTYPES",
    "MODES",
    "CommTimeout",
    "DecodeStream",
    "FastOptions",
    "Plan",
    "ShapeFacts",
    "abort",
    "cast_as_loaded",
    "check",
    "named_configs",
    "parallelize",
    "plan",
    "release",
    "shape_facts",
    "StreamClosed",
    "stream_decode",
    "supported_classes",
    "unparallelize",
    "verify_weights",
    "__version__",
]
