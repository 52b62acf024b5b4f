"""Random tokens, and the hashes they are stored as.

A token is shown once and kept only as its SHA-256. The tokens are 256 random
bits, so a plain hash is enough: there is nothing to guess, and a keyed hash
would tie every stored token to the secret key and break them all when it is
rotated.
"""

from __future__ import annotations

import hashlib
import secrets
from typing import Protocol


def new_token(prefix: str) -> str:
    """A fresh token such as ``llmgw_adm_…``; the prefix says what it is for."""
    return f"{prefix}_{secrets.token_urlsafe(32)}"


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def hint(token: str) -> str:
    """The few characters shown in lists so a person can tell tokens apart."""
    return token[:10] + "…" + token[-4:]


class Account(Protocol):
    is_superuser: bool


def may_issue_token(issuer: Account, owner: Account) -> str | None:
    """Why ``issuer`` may not mint (or re-assign) a token owned by ``owner``, or None when they may.

    A token acts with its owner's powers, so minting one for a superuser is
    becoming one: only a superuser may. Anyone allowed to add tokens at all
    may mint for themselves and for accounts that are not superusers.
    """
    if owner.is_superuser and not issuer.is_superuser:
        return "only a superuser may mint or change a token for a superuser"
    return None
