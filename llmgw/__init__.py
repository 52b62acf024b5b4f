"""llmgw: LLM inference on a fleet of GPU machines."""

from importlib import metadata

__version__ = metadata.version("llmgw")
