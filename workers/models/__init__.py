"""Tiny random-weight models of real transformers architectures, with a locally trained tokenizer.

Tests, the demo and the benchmarks build these instead of downloading from a model hub; a real
model is just a path in config and goes through the same loaders.
"""

from workers.models.tiny import ARCHS, SIZES, TinySpec, build_tiny, tiny_config
from workers.models.tokenizer import train_tokenizer

__all__ = ["ARCHS", "SIZES", "TinySpec", "build_tiny", "tiny_config", "train_tokenizer"]
