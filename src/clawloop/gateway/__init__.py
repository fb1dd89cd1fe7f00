"""OpenAI-compatible gateway with token-exact capture."""

from clawloop.gateway.app import check_bind, create_app

__all__ = ["check_bind", "create_app"]
