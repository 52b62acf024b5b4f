"""Who is calling the admin API (a bearer token) and whether they may (core.access's doors)."""

from __future__ import annotations

from django.utils import timezone
from rest_framework import authentication, exceptions, permissions

from core import access
from core.credentials import bearer_secret, hash_token
from core.models import ApiToken

# Writing last_used_at on every request would turn each read into a write;
# once a minute is enough to tell a live token from a forgotten one.
LAST_USED_RESOLUTION_S = 60


class BearerTokenAuthentication(authentication.BaseAuthentication):
    """``Authorization: Bearer <token>`` with an API token issued to an operator."""

    keyword = "bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode("latin-1")
        secret = bearer_secret(header)
        if secret is None:
            if header.partition(" ")[0].lower() != self.keyword:
                return None  # another scheme: another authenticator's (a session)
            raise exceptions.AuthenticationFailed("the Authorization header has no token after 'Bearer'")
        token = ApiToken.objects.select_related("user").filter(digest=hash_token(secret)).first()
        if token is None or token.revoked_at is not None:
            raise exceptions.AuthenticationFailed("this token is unknown or has been revoked")
        if not token.user.is_active:
            raise exceptions.AuthenticationFailed("the account this token belongs to is disabled")
        now = timezone.now()
        if token.last_used_at is None or (now - token.last_used_at).total_seconds() > LAST_USED_RESOLUTION_S:
            ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        return token.user, token

    def authenticate_header(self, request) -> str:
        return 'Bearer realm="llmgw"'


class DoorPermission(permissions.BasePermission):
    """The caller's Django permissions, as core.access's table names them for this endpoint and method.

    A token acts as its user at this request, never more (a read-only token
    only reads); a session as its user. The 403's sentence names the
    permission that was missing and the shipped group that holds it.
    """

    message = "you may not do this"

    def has_permission(self, request, view) -> bool:
        if request.user is None or not request.user.is_authenticated:
            return False  # DRF answers 401 with the authenticator's challenge
        match = getattr(request, "resolver_match", None)
        # A method the view does not have is no door: DRF answers it with a 405 sentence.
        door = match.url_name if match and hasattr(view, request.method.lower()) else None
        read_only = isinstance(request.auth, ApiToken) and request.auth.read_only
        why = access.refusal(request.user, door, request.method, read_only=read_only)
        if why is not None:
            self.message = why
        return why is None
