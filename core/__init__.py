"""The control plane's own records: API tokens, the audit log, task runs."""
