"""Halo- and tier-aware layers: mixins swapped onto diffusers' own modules (runtime/swap.py) that
compute sharded requests exactly and fast-tier requests through vaeshard's kernels. buffers.py owns
the fast tier's conv-input buffer protocol; tier.py holds the request's fast-tier choices."""
