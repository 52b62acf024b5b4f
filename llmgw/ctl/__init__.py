"""``llmgw ctl``: the operator's command line, a client of the admin API (``/api/v1``).

It runs on an operator's laptop, where no control plane is installed, so it
imports only httpx, rich, PyYAML and the standard library — never Django or
the control-plane apps (an import contract in pyproject.toml holds it to that).
"""
