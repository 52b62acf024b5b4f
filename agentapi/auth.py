"""Join tokens and per-node credentials."""

from __future__ import annotations

from agentapi.limits import REVOKED, SEND_BEARER
from core.credentials import hash_token
from inventory.models import JoinToken, Node


class Refused(Exception):
    """A request the agent must not retry as it is; ``status`` is the HTTP status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def bearer(request) -> str:
    header = request.headers.get("Authorization", "")
    scheme, _, secret = header.partition(" ")
    if scheme.lower() != "bearer" or not secret.strip():
        raise Refused(401, SEND_BEARER)
    return secret.strip()


def check_join_token(secret: str) -> JoinToken:
    token = JoinToken.objects.filter(digest=hash_token(secret)).first()
    if token is None:
        raise Refused(401, "this join token is unknown; copy the current one from the control plane's data dir")
    if token.revoked_at is not None:
        raise Refused(401, f"join token '{token.name}' was revoked; ask an operator for the current one")
    return token


def node_for_credential(secret: str) -> Node:
    node = Node.objects.filter(credential_digest=hash_token(secret)).first()
    if node is None:
        raise Refused(401, REVOKED)

    return node
