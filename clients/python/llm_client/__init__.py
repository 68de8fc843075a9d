"""Python client for the llm server's gRPC API (proto/llm.proto). See README.md."""
from llm_client.client import SAMPLING_PARAMS, Client, Completion, Stream

__all__ = ["Client", "Completion", "Stream", "SAMPLING_PARAMS"]
__version__ = "0.1.0"
