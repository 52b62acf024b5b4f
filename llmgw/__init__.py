"""llmgw: LLM inference on a fleet of GPU machines."""

__version__ = "0.1.0"
