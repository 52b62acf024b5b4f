"""``llmgw ctl COMMAND``: tables for people, ``--json`` for scripts.

1. Read the arguments; a usage mistake exits 2 with argparse's message.
2. Find the server and token (flags, LLMGW_URL/LLMGW_TOKEN, ~/.config/llmgw/ctl.yaml).
3. Run the command against the admin API. A refusal prints the server's own
   sentence on stderr and exits 1; success prints a table, or the answer as
   JSON with ``--json``, and exits 0.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable

from rich.console import Console

from llmgw.ctl import catalog, fleet, show, tenancy
from llmgw.ctl.client import Client, CtlError
from llmgw.ctl.config import ConfigError, resolve

Command = Callable[[Client, Console, argparse.Namespace], object]


def parser() -> argparse.ArgumentParser:
    # Accepted before or after the command. SUPPRESS keeps a subcommand's unset
    # option from overwriting one given before it (argparse's defaults would).
    common = argparse.ArgumentParser(add_help=False, argument_default=argparse.SUPPRESS)
    common.add_argument("--server", help="the admin listener, e.g. http://control:8000 (or LLMGW_URL)")
    common.add_argument("--token", help="an API token (or LLMGW_TOKEN)")
    common.add_argument("--actor", help="who to record in the audit log instead of the token's owner (or LLMGW_ACTOR)")
    common.add_argument("--json", action="store_true", help="print the server's answer as JSON")
    top = argparse.ArgumentParser(prog="llmgw ctl", description="Operate an llmgw control plane.", parents=[common])
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def cmd(name: str, run: Command, help: str, *args: tuple[tuple, dict]) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, parents=[common], description=help)
        for flags, options in args:
            p.add_argument(*flags, **options)
        p.set_defaults(run=run)
        return p

    def arg(*flags: str, **options) -> tuple[tuple, dict]:
        return flags, options

    cmd("status", fleet.status, "the whole fleet at a glance")
    cmd("nodes", fleet.nodes, "every node, its devices by class and what is free")
    cmd("node", fleet.node, "one node: cards, NVLink, NUMA, nearest NIC, ports, shards", arg("node"))
    cmd("cordon", fleet.set_state("cordon"), "place nothing new on a node", arg("node"))
    cmd("uncordon", fleet.set_state("uncordon"), "let a node take work again", arg("node"))
    cmd("drain", fleet.set_state("drain"), "move a node's replicas off it (replacement first)", arg("node"))
    cmd("resume-moves", fleet.resume_moves, "end every partition: replicas on its silent nodes move at the normal rate")
    cmd(
        "logs",
        fleet.logs,
        "the last lines each engine on a node wrote",
        arg("node"),
        arg("--shard", help="one shard, by its id or its replica's id"),
    )
    cmd("nvlink", fleet.nvlink, "NVLink domains and what keeps any node out")
    cmd("fabrics", fleet.fabrics, "InfiniBand/RoCE fabrics and their problems")
    cmd("topology", fleet.topology, "one fabric: subnet managers, problems, adapters", arg("fabric"))
    cmd("scan", fleet.scan, "ask for a fresh topology scan of a fabric", arg("fabric"))
    cmd(
        "what-if",
        fleet.what_if,
        "what losing nodes, an NVLink domain, a fabric or LABEL=VALUE would stop and where it would go",
        arg("action", choices=["lose"]),
        arg("targets", nargs="+", metavar="NODE|DOMAIN|FABRIC|LABEL=VALUE"),
    )

    cmd("models", catalog.models, "every model, its scaling and replicas")
    cmd("add-model", catalog.add_model, "add a model from a YAML definition", arg("file", metavar="FILE.yaml"))
    cmd("remove-model", catalog.remove_model, "remove a model", arg("model"))
    cmd(
        "scale",
        catalog.scale,
        "set a model's replica range",
        arg("model"),
        arg("min", type=int),
        arg("max", type=int, nargs="?"),
        arg("--idle-timeout", help="scale down after this long unused, like 30m; 'never' to turn it off"),
    )
    cmd("replicas", catalog.replicas, "replicas, their shards and downloads in flight", arg("model", nargs="?"))
    cmd("explain", catalog.explain, "why a model is or is not placed", arg("model"))
    cmd("capacity", catalog.capacity, "measured capacity per model and profile")
    cmd("orphans", catalog.orphans, "weights on disk that no model refers to")
    cmd(
        "collect",
        catalog.collect,
        "ask the agents to delete the orphaned weights",
        arg("--node", action="append", help="only this node (repeatable)"),
    )
    cmd(
        "prefetch",
        catalog.prefetch,
        "pull a model's weights onto nodes without starting it",
        arg("model"),
        arg("--pool", help="every node of this pool (with --count, that many of them)"),
        arg("--nodes", help="these nodes, comma separated"),
        arg("--count", type=int, help="this many nodes that lack the weights"),
    )
    cmd(
        "usage",
        tenancy.usage,
        "what each team (or org, or key) spent",
        arg("--by", default="team", choices=["org", "team", "key"]),
        arg("--since", default="24h"),
    )
    keys = sub.add_parser("keys", help="gateway API keys", parents=[common]).add_subparsers(dest="sub", required=True)
    create = keys.add_parser("create", help="issue a key (printed once)", parents=[common])
    create.add_argument("--team", required=True)
    create.add_argument("--org")
    create.add_argument("--models", help="only these models, comma separated")
    create.set_defaults(run=tenancy.keys_create)
    keys.add_parser("list", help="every key", parents=[common]).set_defaults(run=tenancy.keys_list)
    revoke = keys.add_parser("revoke", help="revoke a key", parents=[common])
    revoke.add_argument("id")
    revoke.set_defaults(run=tenancy.keys_revoke)
    budgets = sub.add_parser("budgets", help="spending budgets", parents=[common]).add_subparsers(
        dest="sub", required=True
    )
    bset = budgets.add_parser("set", help="set a budget", parents=[common])
    bset.add_argument("scope", choices=["org", "team", "key"])
    bset.add_argument("name")
    bset.add_argument("amount", help="in currency units, like 100 or 12.50")
    bset.add_argument("--period", default="month", choices=["day", "week", "month"])
    bset.set_defaults(run=tenancy.budgets_set)
    budgets.add_parser("list", help="every budget", parents=[common]).set_defaults(run=tenancy.budgets_list)
    return top


def main(argv: list[str] | None = None, *, transport=None, stdout=None, stderr=None) -> int:
    args = parser().parse_args(argv)
    for name, default in (("server", None), ("token", None), ("actor", None), ("json", False)):
        if not hasattr(args, name):
            setattr(args, name, default)
    # show.Console: whatever the server sent is printed as text, never as markup.
    out = show.Console(file=stdout or sys.stdout, soft_wrap=False)
    err = show.Console(file=stderr or sys.stderr, stderr=True, soft_wrap=True)
    try:
        settings = resolve(args.server, args.token, args.actor)
    except ConfigError as exc:
        err.print(f"llmgw ctl: {exc}", markup=False, highlight=False)
        return 2
    client = Client(settings, transport=transport)
    try:
        answer = args.run(client, out, args)
    except CtlError as exc:
        err.print(f"llmgw ctl: {exc.message}", markup=False, highlight=False)
        return 1
    if args.json:
        print(json.dumps(answer, indent=2, sort_keys=True), file=stdout or sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
