"""ctl commands about the fleet: status, nodes, node, cordon/uncordon/drain, resume-moves, logs, nvlink, fabrics,
topology, what-if."""

from __future__ import annotations

from urllib.parse import quote

from rich.console import Console

from llmgw.ctl import show
from llmgw.ctl.client import Client


def status(client: Client, console: Console, args) -> object:
    s = client.get("summary")
    if args.json:
        return s
    n = s["nodes"]
    console.print(
        show.markup(
            "[bold]nodes[/] {}: {} ready, {} cordoned, {} draining, {} unreachable",
            *(n[k] for k in ("total", "ready", "cordoned", "draining", "unreachable")),
        )
    )
    t = show.table("CLASS", "TOTAL", "USED", "FREE", "UNHEALTHY", "HELD", title="devices by class")
    for c in s["gpus"]:
        t.add_row(c["class"], *(str(c[k]) for k in ("total", "used", "free", "unhealthy", "held")))
    console.print(t)
    if s["fabrics"]:
        t = show.table("FABRIC", "NODES", "LARGEST FREE BLOCK", "NODES WITH WEIGHTS", "MODELS", title="fabrics")
        for f in s["fabrics"]:
            t.add_row(
                f["fabric"],
                str(f["nodes"]),
                str(f["largest_free_block"]),
                str(f["nodes_with_weights"]),
                str(f["models_present"]),
            )
        console.print(t)
    r, m = s["replicas"], s["models"]
    console.print(
        show.markup(
            "[bold]replicas[/] {}: {} ready, {} starting ({} downloading), {} stopping, {} failed, {} stale",
            *(r[k] for k in ("total", "ready", "starting", "fetching", "stopping", "failed", "stale")),
        )
    )
    console.print(show.markup("[bold]models[/] {}: {} satisfied, {} short", m["total"], m["satisfied"], m["short"]))
    if s["unplaceable"]:
        console.print(
            show.markup("[red]unplaceable:[/] {}  (see `llmgw ctl explain MODEL`)", ", ".join(s["unplaceable"]))
        )
    for p in s["parked"]:
        console.print(
            show.markup("[red]parked:[/] {} after {} failed starts: {}", p["model"], p["failures"], p["reason"])
        )
    for i in s["idle_replicas"]:
        console.print(
            show.markup(
                "[yellow]idle:[/] {}#{} holds {} GPUs, unused for {}",
                i["model"],
                i["id"],
                i["gpus"],
                show.ago(i["idle_seconds"]),
            )
        )
    for member in s.get("store", []):
        lag = "?" if member["lag"] < 0 else show.size(member["lag"])
        console.print(
            show.markup(
                "[bold]store[/] {} ({}) {} {} lag {}",
                member["name"],
                member["host"],
                member["role"],
                member["state"],
                lag,
            )
        )
    if s.get("store_error"):
        console.print(show.markup("[red]store:[/] {}", s["store_error"]))
    for p in s.get("partitions", []):
        until = p.get("until")
        ends = show.markup("; at {} those still silent are lost and moved at the normal rate" if until else "", until)
        console.print(
            show.markup(
                "[red]partition:[/] {}: {} of {} nodes silent since {} ({}); nothing on them moves until they "
                "answer or `llmgw ctl resume-moves`{}",
                p["group"],
                len(p["nodes"]),
                p["members"],
                p["since"],
                _first(p["nodes"]),
                ends,
            )
        )
    return None


def _first(names: list[str], shown: int = 5) -> str:
    return ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")


def resume_moves(client: Client, console: Console, args) -> object:
    answer = client.post("moves/resume")
    if args.json:
        return answer
    if not answer["resumed"]:
        console.print("no partition was open; moves run at the normal rate")
    for p in answer["resumed"]:
        console.print(
            show.markup(
                "resumed moves in {}: its {} silent nodes are moved at the normal rate", p["group"], len(p["nodes"])
            )
        )
    return None


def _state(n: dict) -> show.Markup:
    return show.markup("{}" if n["reachable"] else "{}, [red]unreachable[/]", n["state"])


# What the table reads: asking for only these skips each node's cards and ports, most of a large listing.
NODE_TABLE_FIELDS = "id,state,reachable,devices,replicas,nvlink_domain,load,last_seen_seconds,unhealthy_gpus"


def nodes(client: Client, console: Console, args) -> object:
    if args.json:
        return client.get("nodes")
    rows = client.get("nodes", fields=NODE_TABLE_FIELDS)
    t = show.table("NODE", "STATE", "DEVICES (FREE/TOTAL)", "REPLICAS", "NVLINK", "CPU", "SEEN")
    for n in rows:
        load = n.get("load", {})
        cpu = f"{load['cpu_percent']:.0f}%" if "cpu_percent" in load else "-"
        t.add_row(
            n["id"],
            _state(n),
            show.devices(n["devices"]),
            str(n["replicas"]),
            "yes" if n.get("nvlink_domain") else "-",
            cpu,
            show.ago(n.get("last_seen_seconds")),
        )
    console.print(t)
    for n in rows:
        for line in n["unhealthy_gpus"]:
            console.print(show.markup("[yellow]{}[/] {}", n["id"], line))
    return None


def node(client: Client, console: Console, args) -> object:
    n = client.get(f"nodes/{quote(args.node, safe='')}")
    if args.json:
        return n
    console.print(
        show.markup("[bold]{}[/] {}  {}  agent {}", n["id"], _state(n), n.get("os", ""), n.get("agent_version", "?"))
    )
    console.print(f"devices: {show.devices(n['devices'])}; replicas: {n['replicas']}")
    if n.get("nvlink_domain") or n.get("imex"):
        console.print(f"NVLink domain: {n.get('nvlink_domain', 'none')}; IMEX {n.get('imex', 'not reported')}")
    if n["gpus"]:
        t = show.table("GPU", "CLASS", "NUMA", "NEAREST NIC", "FABRIC", "DOMAIN", "HEALTH", "HELD BY", title="GPUs")
        for g in n["gpus"]:
            nic = f"{g['nearest_nic']} ({g['nic_path']})" if "nearest_nic" in g else "-"
            fabric = show.markup("{} [yellow]degraded[/]" if g.get("degraded") else "{}", g.get("fabric_state", "-"))
            t.add_row(
                g["label"],
                g["class"],
                str(g.get("numa", "?")),
                nic,
                fabric,
                g.get("domain", "-"),
                "ok" if g["healthy"] else show.markup("[red]{}[/]", g["health"][0]),
                g.get("held_by", ""),
            )
        console.print(t)
        _nvlink_matrix(console, n["gpus"])
    if n["ib_ports"]:
        t = show.table("PORT", "STATE", "RATE", "FABRIC", "PHYSICAL", "ERRORS", title="InfiniBand / RoCE")
        for p in n["ib_ports"]:
            errors = ", ".join(f"{k} {v}" for k, v in p["errors"].items()) or "-"
            t.add_row(
                f"{p['hca']}/{p['port']}",
                p["state"],
                f"{p.get('rate_gbps', '?')} Gb/s",
                p.get("fabric", "-"),
                p.get("physical", p.get("sm_error", "?")),
                errors,
            )
        console.print(t)
    if n["shards"]:
        t = show.table("SHARD", "MODEL", "GPUS", "STATE", "ERROR", title="shards")
        for s in n["shards"]:
            t.add_row(s["id"], s["model"], ",".join(s["gpus"]), s["state"], s.get("error", ""))
        console.print(t)
    _health(console, n)
    for line in n.get("problems", []) + n.get("warnings", []):
        console.print(show.markup("[yellow]{}[/]", line))
    return None


def _health(console: Console, n: dict) -> None:
    """What card health holds and did on the node (absent from an older control plane's answer)."""
    if n.get("health_cordon"):
        console.print(show.markup("[red]cordoned by card health:[/] {}", n["health_cordon"]))
    for h in n.get("held_gpus", []):
        console.print(show.markup("[red]gpu {} held[/] since {}: {}", h["gpu"], h["since"], h["reason"]))
    if n.get("health_actions"):
        t = show.table("WHEN", "ACTION", "TARGET", "REASON", title="card health actions")
        for a in n["health_actions"]:
            t.add_row(a["at"], a["action"], a["target"], a["reason"])
        console.print(t)


def _nvlink_matrix(console: Console, gpus: list[dict]) -> None:
    """Which cards reach which over NVLink, drawn from each card's peers."""
    cards = [g for g in gpus if "parent" not in g]
    if not any(g.get("nvlink_peers") for g in cards):
        return
    t = show.table("", *(g["label"] for g in cards), title="NVLink")
    for g in cards:
        peers = set(g.get("nvlink_peers") or [])
        t.add_row(
            g["label"], *("X" if o["index"] == g["index"] else ("NV" if o["index"] in peers else "·") for o in cards)
        )
    console.print(t)


def set_state(word: str):
    def run(client: Client, console: Console, args) -> object:
        answer = client.post(f"nodes/{quote(args.node, safe='')}/state", {"state": word})
        if args.json:
            return answer
        console.print(f"{answer['id']}: {answer['previous']} → {answer['state']}")
        return None

    return run


def logs(client: Client, console: Console, args) -> object:
    answer = client.get(f"nodes/{quote(args.node, safe='')}/logs", shard=args.shard)
    if args.json:
        return answer
    if not answer["shards"]:
        console.print(f"{answer['node']} reports no shards")
    for s in answer["shards"]:
        console.print(show.markup("[bold]== {}[/] {}", s["id"], s.get("state", "")))
        for line in s.get("lines", ["(the agent sent no lines)"]):
            console.print(line, highlight=False)
    return None


def nvlink(client: Client, console: Console, args) -> object:
    report = client.get("nvlink")
    if args.json:
        return report
    if not report["domains"] and not report["unassigned"]:
        console.print("no multi-node NVLink domain has been reported")
    for d in report["domains"]:
        name = d.get("name") or d["key"]
        console.print(
            show.markup(
                "[bold]{}[/]: {}/{} nodes in, {} ready for multi-node; {}/{} GPUs joined, {} degraded",
                name,
                *(d[k] for k in ("nodes_in", "nodes_total", "nodes_ready", "gpus_joined", "gpus_total")),
                d["gpus_degraded"],
            )
        )
        _out(console, d["nodes"])
    if report["unassigned"]:
        console.print(show.markup("[bold]trying to join, in no known domain[/]"))
        _out(console, report["unassigned"])
    return None


def _out(console: Console, nodes: list[dict]) -> None:
    for n in nodes:
        for line in n["out"]:
            console.print(show.markup("  [red]{}[/] {}", n["node"], line))
        for line in n["warnings"]:
            console.print(show.markup("  [yellow]{}[/] {}", n["node"], line))


def fabrics(client: Client, console: Console, args) -> object:
    report = client.get("fabrics")
    if args.json:
        return report
    t = show.table("ID", "FABRIC", "KIND", "NODES", "PORTS", "RATE")
    for p in report["physical"]:
        rate = f"{p['rate_gbps']:g} Gb/s" if p["rate_gbps"] is not None else "?"
        t.add_row(p["id"], p["label"], p["kind"], str(len(p["nodes"])), str(len(p["ports"])), rate)
    console.print(t)
    for problem in report["problems"]:
        console.print(show.markup("[yellow]{}[/] {}", problem["kind"], problem["message"]))
    return None


def topology(client: Client, console: Console, args) -> object:
    page = client.get(f"fabrics/{quote(args.fabric, safe='')}/topology")
    if args.json:
        return page
    console.print(show.markup("[bold]{}[/] ({}), {} nodes", page["label"], page["key"], len(page["nodes"])))
    for e in page["sms"]:
        console.print(f"SM {e['kind']} at {e['at']}: {e['old'] or 'none'} → {e['new'] or 'none'}, {e['ports']} ports")
    for problem in page["problems"]:
        console.print(show.markup("[yellow]{}[/] {}", problem["kind"], problem["message"]))
    t = show.table("NODE", "PORT", "STATE", "RATE", "ERRORS", title="this cluster's adapters")
    for p in page["live"]:
        errors = ", ".join(f"{k} {v}" for k, v in p["errors"].items()) or "-"
        t.add_row(p["node"], f"{p['hca']}/{p['port']}", p["state"], f"{p.get('rate_gbps', '?')} Gb/s", errors)
    console.print(t)
    if "map" in page:
        counts = page["map"]["counts"]
        scan = page.get("scan") or {}
        console.print(
            f"map: {counts.get('switches', 0)} switches, {counts.get('hosts', 0)} hosts, "
            f"{counts.get('links', 0)} links (scanned {scan.get('scanned_at')} by {scan.get('node')})"
        )
    if page.get("map_note"):
        console.print(page["map_note"])
    return None


def scan(client: Client, console: Console, args) -> object:
    answer = client.post(f"fabrics/{quote(args.fabric, safe='')}/scan")
    if args.json:
        return answer
    console.print(f"scan of {answer['fabric']} requested; its node runs it with its next full report")
    return None


# How a replacement's shards would talk, and what kind of part a target named, as the table says them.
_OVER = {"single_node": "one node", "nvlink": "NVLink", "infiniband": "InfiniBand"}
_KIND = {"node": "node", "nvlink_domain": "NVLink domain", "fabric": "fabric", "label": "label"}


def _gpu_list(labels: list[str]) -> str:
    """GPU labels as people write them: a run of whole cards as 0-7, anything else (MIG instances) listed."""
    if len(labels) > 2 and all(x.isdigit() for x in labels):
        numbers = [int(x) for x in labels]
        if numbers == list(range(numbers[0], numbers[0] + len(numbers))):
            return f"{numbers[0]}-{numbers[-1]}"
    return ",".join(labels)


def _destination(s: dict) -> str:
    to = s.get("to")
    if not to:
        return s["why"]
    where = ", ".join(f"{sh['node']}:{_gpu_list(sh['gpu_labels'])}" for sh in to["shards"])
    return where if to["profile"] == s["profile"] else f"{where} (as {to['profile']})"


def what_if(client: Client, console: Console, args) -> object:
    """What losing the named parts would stop, where it would go, who would be short; the server changes nothing."""
    answer = client.get("what-if", lose=list(args.targets))
    if args.json:
        return answer
    parts = ", ".join(
        f"{t['target']} ({_KIND.get(t['kind'], t['kind'])}, {len(t['nodes'])} node{'s' * (len(t['nodes']) != 1)})"
        for t in answer["lose"]
    )
    console.print(show.markup("[bold]what if[/] we lose {}", parts))
    if answer["stopped"]:
        t = show.table("REPLICA", "PROFILE", "ON", "WOULD GO TO", "OVER", title="replicas that would stop")
        for s in answer["stopped"]:
            to = s.get("to")
            over = _OVER.get(to["interconnect"], to["interconnect"]) if to else "-"
            if to and (to.get("nvlink_domain") or to.get("fabric")):
                over = f"{over} {to.get('nvlink_domain') or to.get('fabric')}"
            t.add_row(f"{s['model']}#{s['replica']}", s["profile"], ",".join(s["nodes"]), _destination(s), over)
        console.print(t)
    for m in answer["short"]:
        today = " (short today already)" if m["short_today"] else ""
        console.print(show.markup("[red]short:[/] {}: {} of {} replicas{}", m["model"], m["after"], m["wanted"], today))
        for r in m["reasons"]:
            where = " ".join(x for x in (r.get("pool") and f"pool {r['pool']}", r.get("node")) if x)
            many = f" ({r['nodes']} candidates)" if r.get("nodes", 1) > 1 else ""
            console.print(f"  {r['profile']}{' ' + where if where else ''}: {r['reason']}{many}")
    moves = answer["moves"]
    if moves["count"]:
        console.print(
            show.markup(
                "[bold]moves[/] {} at {} a minute: within {} min", moves["count"], moves["per_minute"], moves["minutes"]
            )
        )
    console.print(answer["note"])
    return None
