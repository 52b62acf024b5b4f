"""Serializers that describe what the API answers, for the OpenAPI schema.

The views answer the plain data the shared ``reads`` functions build;
these classes say what that data is, field by field. A field that is not
``required`` is left out when unknown, never sent as null (the few nullable
ones say so).
"""
