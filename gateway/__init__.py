"""The OpenAI-compatible gateway: API keys, tenancy, usage and budgets."""
