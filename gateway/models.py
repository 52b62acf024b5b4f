"""Models for the gateway (keys, scopes, usage) arrive with the gateway issue."""
