"""The fast tier's Triton and Gluon kernels: leaves that import only torch and triton. routing.py
answers, per convolution, which kernel runs and what it reads and writes."""

from .weights import forget as forget_weights

__all__ = ["forget_weights"]
