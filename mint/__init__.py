"""MinT's public SDK and the ``mint`` command line. Sits on top; nothing imports it."""

__version__ = "0.1.0"
__all__ = ["__version__"]
