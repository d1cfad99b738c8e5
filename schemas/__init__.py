"""Wire contracts and configuration: the bottom layer, importing nothing else of MinT."""

from schemas.settings import MintSettings, get_settings

__all__ = ["MintSettings", "get_settings"]
