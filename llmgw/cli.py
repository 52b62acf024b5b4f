"""The ``llmgw`` command.

A few commands are llmgw's own (serve, and those added by later issues:
agent, ctl, discover, doctor, simulate); anything else is handed to Django's
management commands, so ``llmgw migrate`` and ``llmgw createsuperuser`` work
as they would with manage.py.

Commands that run on a node (agent, discover, doctor) and ``ctl`` never
import Django: they must work on a machine with no control plane installed.
"""

from __future__ import annotations

import importlib
import os
import sys

# Django-free: reading the configuration must not start Django.
from core import config

# command -> module with a ``main(argv) -> int``
OWN_COMMANDS = {
    "serve": "llmgw.serve",
    "discover": "agent.discover_cmd",
    "agent": "agent.agent_cmd",
    "simulate": "agent.simulate_cmd",
    "doctor": "agent.doctor_cmd",
    "ctl": "llmgw.ctl.main",
}


def _configuration_error(exc) -> int:
    print(f"llmgw: configuration error: {exc}", file=sys.stderr)
    return 2


def django_main(argv: list[str]) -> int:
    try:
        config.load()
    except config.ConfigError as exc:
        return _configuration_error(exc)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(["llmgw", *argv])
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print("usage: llmgw COMMAND [ARGS]\n\nllmgw's own commands: " + ", ".join(sorted(OWN_COMMANDS)))
        print("anything else is a Django management command (migrate, createsuperuser, shell, …)")
        return 0
    module = OWN_COMMANDS.get(argv[0])
    if module is None:
        return django_main(argv)
    return importlib.import_module(module).main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
