"""Wan 2.1 / 2.2 (diffusers AutoencoderKLWan): the adapter (adapter.py), its frame loop (frames.py) and its
fast-tier blocks (blocks.py)."""

from .adapter import FAMILY, WanLike

__all__ = ["FAMILY", "WanLike"]
