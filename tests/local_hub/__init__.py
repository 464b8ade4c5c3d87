"""A local Hugging Face Hub on 127.0.0.1 for the tests: the real `huggingface_hub` client talks to it over HTTP."""

from local_hub.hub_server import DEFAULT_TOKEN, DEFAULT_USER, LocalHubServer, use_local_hub

__all__ = ["DEFAULT_TOKEN", "DEFAULT_USER", "LocalHubServer", "use_local_hub"]
