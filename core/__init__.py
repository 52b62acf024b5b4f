"""What every app stands on.

- The control plane's own records: API tokens, the audit log, task runs, the doctor's findings (models.py).
- Who may do what: the doors and their permissions (access.py), the shipped groups (roles.py), the API's
  token and permission checks (auth.py), how secrets are made and kept (credentials.py).
- The environment, read and checked once (config.py).
- The database and speed tooling the hot paths share: connection pools (dbpool.py), compiled queries
  (compiled.py, pipelined.py, rowinsert.py), row fingerprints (fingerprints.py), JSON in and out
  (jsonbody.py, jsontext.py, jsonrows.py, storable.py), locks, failover and outage notes.
"""
