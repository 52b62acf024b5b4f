"""Where the real hardware captures live: ``../shared/fixtures`` beside the checkout.

They are read, never edited. ``LLMGW_FIXTURES`` points elsewhere (a CI copy).
"""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(os.environ.get("LLMGW_FIXTURES") or REPO.parent / "shared" / "fixtures")


def capture(name: str) -> Path:
    path = FIXTURES / name
    if not path.exists():
        raise FileNotFoundError(f"capture {name} is not in {FIXTURES}")
    return path


def read(name: str) -> str:
    return capture(name).read_text(errors="replace")


def all_captures(prefix: str = "", suffix: str = "") -> list[Path]:
    return sorted(p for p in FIXTURES.iterdir() if p.name.startswith(prefix) and p.name.endswith(suffix))
