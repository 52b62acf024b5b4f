"""Engine name (as profiles name it) → its module: command line, probe paths, which ranks serve."""

from __future__ import annotations

from types import ModuleType

from agent.supervisor import llamacpp, sglang, vllm

ENGINES: dict[str, ModuleType] = {"vllm": vllm, "sglang": sglang, "llamacpp": llamacpp}


def engine(name: str | None) -> ModuleType | None:
    """None when the engine is unknown to this agent (a newer control plane, or none given)."""
    return ENGINES.get(name or "")
