"""The front door: an OpenAI-compatible HTTP gateway over the engines' Kafka topics.

``mint gateway`` runs one instance (gateway.main); scale out by starting more. Design notes,
reply routing and limits: gateway/README.md.
"""

from gateway.app import create_app
from gateway.config import GatewayConfig
from gateway.service import Gateway

__all__ = ["Gateway", "GatewayConfig", "create_app"]
