"""How the OpenAPI schema describes the API's authentication: a bearer token."""

from drf_spectacular.extensions import OpenApiAuthenticationExtension


class BearerTokenScheme(OpenApiAuthenticationExtension):
    target_class = "core.auth.BearerTokenAuthentication"
    name = "bearerToken"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "An API token: `llmgw token create --user NAME [--read-only]`, or the admin's API tokens.",
        }
