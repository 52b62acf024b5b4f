"""The admin API, ``/api/v1``: thin DRF views over the functions the console uses too.

Each view calls a function from an app's ``reads`` module (or
``observability.fleet_summary``) and answers its result as it is; the serializers in
``serializers/`` describe those shapes for the OpenAPI schema, and the tests
check every answer against that schema.
"""
