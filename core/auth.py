"""Bearer-token authentication for the admin API."""

from __future__ import annotations

from django.utils import timezone
from rest_framework import authentication, exceptions

from core.credentials import hash_token
from core.models import ApiToken

# Writing last_used_at on every request would turn each read into a write;
# once a minute is enough to tell a live token from a forgotten one.
LAST_USED_RESOLUTION_S = 60


class BearerTokenAuthentication(authentication.BaseAuthentication):
    """``Authorization: Bearer <token>`` with an API token issued to an operator."""

    keyword = "bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode("latin-1")
        scheme, _, secret = header.partition(" ")
        if scheme.lower() != self.keyword:
            return None
        secret = secret.strip()
        if not secret:
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
