"""Parsers for ``nvidia-smi -q -x`` (XML), ``nvidia-smi -q`` (plain text) and ``nvidia-smi -L``.

Each parser is pure: text in, :class:`SmiLog` (or :class:`SmiListing`) out, and
:class:`DiscoveryError` with a sentence for input it cannot read. The XML and
the text parser fill the same structures with the *raw* strings nvidia-smi
printed ("81559 MiB", "N/A", "GPU is lost"): turning them into facts is
:mod:`agent.discovery.gpus`'s job, and keeping the raw text lets the NVML fake
answer exactly as the driver did (``N/A`` becomes NOT_SUPPORTED, ``GPU is
lost`` becomes GPU_IS_LOST).

The parts: ``records`` (what the parsers fill, and the raw values' helpers),
``xml``, ``text`` and ``listing`` (``-L`` and the fabric block).

A field that is ``None`` was not in the capture at all (an older driver, a
``-d`` partial query, a trimmed file): unknown, never zero.
"""

from agent.discovery.nvidia_smi.listing import (
    ListedGpu,
    ListedMig,
    SmiListing,
    parse_fabric_block,
    parse_list,
)
from agent.discovery.nvidia_smi.records import (
    GPU_LOST,
    HISTOGRAM_BUCKETS,
    NOT_AVAILABLE,
    SmiGpu,
    SmiLog,
    SmiMigDevice,
    SmiProcess,
    integer,
    is_lost,
    is_missing,
    normalize_bus_id,
    number,
    yes_no,
)
from agent.discovery.nvidia_smi.text import (
    parse_text,
)
from agent.discovery.nvidia_smi.xml import (
    parse_xml,
)

__all__ = [
    "GPU_LOST",
    "HISTOGRAM_BUCKETS",
    "NOT_AVAILABLE",
    "ListedGpu",
    "ListedMig",
    "SmiGpu",
    "SmiListing",
    "SmiLog",
    "SmiMigDevice",
    "SmiProcess",
    "integer",
    "is_lost",
    "is_missing",
    "normalize_bus_id",
    "number",
    "parse_fabric_block",
    "parse_list",
    "parse_text",
    "parse_xml",
    "yes_no",
]
