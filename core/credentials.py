"""The secrets llmgw issues, and the one way every one of them is stored.

Admin API tokens, join tokens, node credentials and the gateway's API keys
follow one policy, written here and nowhere else:

- Made of 256 random bits from ``secrets`` (``random_secret``), shown once.
- Stored only as their SHA-256 (``hash_token``): unsalted, and not keyed
  with a server secret.
- Found by that digest, through a unique index; a digest compared in Python
  is compared in constant time (``same_digest``).

Why a plain hash is the right one for these secrets:

- Nothing to guess. A slow KDF (bcrypt, scrypt, argon2) and a salt protect
  secrets people choose, which are few enough to try offline. Nobody can try
  2**256: a slow hash would add nothing but its cost to every request (the
  gateway checks a key on each one).
- A lookup by digest needs a deterministic hash: with a salt, the row would
  be needed before the digest could be computed, which means a scan.
- No pepper (an HMAC under a server secret). Against a stolen copy of the
  database it adds nothing when guessing is already hopeless, and it ties
  every stored secret to a second secret that every host must share and
  nobody may lose or rotate: either would turn every key away at once.
- The index's timing reveals nothing: whoever sends a guess cannot steer
  its digest byte by byte, so learning how far a comparison ran tells them
  nothing about any stored secret. ``same_digest`` covers a comparison made
  in Python all the same.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import Any, Protocol

SECRET_BYTES = 32
"""256 random bits: too many to guess, which is why a plain SHA-256 is enough."""


def random_secret() -> str:
    """A fresh secret's random part: SECRET_BYTES random bytes, URL-safe."""
    return secrets.token_urlsafe(SECRET_BYTES)


def new_token(prefix: str) -> str:
    """A fresh token such as ``llmgw_adm_…``; the prefix says what it is for."""
    return f"{prefix}_{random_secret()}"


def hash_token(token: str) -> str:
    """What a secret is stored and looked up as: its SHA-256, in hex (the policy above)."""
    return hashlib.sha256(token.encode()).hexdigest()


def bearer_secret(authorization: str) -> str | None:
    """The secret of an ``Authorization: Bearer <secret>`` header's value, or None for any other.

    The one reading of the header, for the admin API (core.auth), the agents'
    endpoints on both lanes (agentapi) and the gateway: the scheme in any
    case, one space, the secret with the white space around it stripped.
    None when the scheme is another or the secret is empty.
    """
    scheme, _, secret = authorization.partition(" ")
    secret = secret.strip()
    return secret if scheme.lower() == "bearer" and secret else None


def same_digest(stored: str, wanted: str) -> bool:
    """Whether two digests are equal, compared in constant time."""
    return hmac.compare_digest(stored, wanted)


def hint(token: str) -> str:
    """The few characters shown in lists so a person can tell tokens apart."""
    return token[:10] + "…" + token[-4:]


class Account(Protocol):
    pk: Any
    is_superuser: bool

    def get_all_permissions(self, obj: Any = None) -> set[str]: ...


def may_issue_token(issuer: Account, owner: Account) -> str | None:
    """Why ``issuer`` may not mint (or re-assign) a token owned by ``owner``, or None when they may.

    A token acts with its owner's powers, so minting one for somebody else is
    taking their powers: a superuser may mint for anyone, anyone else for
    themselves and for accounts whose every permission they hold already
    (never for a superuser). Without this, a user allowed only to add tokens
    could mint one for a colleague with more permissions and act as them.
    """
    if issuer.is_superuser or issuer.pk == owner.pk:
        return None
    if owner.is_superuser:
        return "only a superuser may mint or change a token for a superuser"
    beyond = sorted(owner.get_all_permissions() - issuer.get_all_permissions())
    if beyond:
        more = f" and {len(beyond) - 3} more" if len(beyond) > 3 else ""
        return (
            f"that account holds permissions you do not ({', '.join(beyond[:3])}{more}); "
            "a token acts with its owner's permissions, so only they or a superuser may mint one for them"
        )
    return None
