"""Test utilities shared by the robust-pretrain test-suite (and usable by downstream tests)."""

from robust_pretrain.testing.hub_server import DEFAULT_TOKEN, DEFAULT_USER, LocalHubServer, use_local_hub

__all__ = ["DEFAULT_TOKEN", "DEFAULT_USER", "LocalHubServer", "use_local_hub"]
