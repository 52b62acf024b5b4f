"""Random tokens, and the hashes they are stored as.

A token is shown once and kept only as its SHA-256. The tokens are 256 random
bits, so a plain hash is enough: there is nothing to guess, and a keyed hash
would tie every stored token to the secret key and break them all when it is
rotated.
"""

from __future__ import annotations

import hashlib
import secrets


def new_token(prefix: str) -> str:
    """A fresh token such as ``llmgw_adm_…``; the prefix says what it is for."""
    return f"{prefix}_{secrets.token_urlsafe(32)}"


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def hint(token: str) -> str:
    """The few characters shown in lists so a person can tell tokens apart."""
    return token[:10] + "…" + token[-4:]
