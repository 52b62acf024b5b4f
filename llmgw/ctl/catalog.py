"""ctl commands about models: models, add-model, remove-model, scale, replicas, explain, capacity, orphans, collect,
prefetch."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

import yaml
from rich.console import Console

from llmgw.ctl import show
from llmgw.ctl.client import Client, CtlError


def models(client: Client, console: Console, args) -> object:
    rows = client.get("models")
    if args.json:
        return rows
    t = show.table("MODEL", "READY", "WANTED", "MIN-MAX", "IDLE TIMEOUT", "PROFILES", "ALIASES", "")
    for m in rows:
        flags = [
            w for w, on in (("parked", m["parked"]), ("unplaceable", m["unplaceable"]), ("file", m["read_only"])) if on
        ]
        idle = show.ago(m["idle_timeout_seconds"]) if "idle_timeout_seconds" in m else "never"
        t.add_row(
            m["name"],
            f"{m['ready_replicas']}/{m['total_replicas']}",
            str(m.get("desired_replicas", m["min_replicas"])),
            f"{m['min_replicas']}-{m['max_replicas']}",
            idle,
            ", ".join(m["profiles"]),
            ", ".join(m["aliases"]),
            " ".join(flags),
        )
    console.print(t)
    for m in rows:
        if m.get("autoscale"):
            console.print(show.markup("[bold]{}[/]: {}", m["name"], m["autoscale"]["reason"]))
    for m in rows:
        if m.get("adapters"):
            names = ", ".join(a["name"] for a in m["adapters"])
            console.print(show.markup("[bold]{}[/] adapters: {}", m["name"], names))
    for m in rows:
        for p in m.get("prefetch") or []:
            console.print(show.markup("[bold]{}[/] weights on {}: {}", m["name"], p["node"], prefetch_state(p)))
    return None


def prefetch_state(p: dict) -> str:
    """'fetching, 25% of 16.0 GB', 'done at /path', 'failed: why', 'requested'."""
    if p["state"] == "fetching":
        progress = {"bytes_done": p.get("bytes_done") or 0, "bytes_total": p.get("bytes_total")}
        if p.get("bytes_total"):
            progress["percent"] = int(100 * progress["bytes_done"] / p["bytes_total"])
        return f"fetching, {show.fetch(progress)}"
    if p["state"] == "done":
        return f"done at {p.get('path', '?')}"
    if p["state"] == "failed":
        return f"failed: {p.get('error', '')}"
    return p["state"]


def prefetch(client: Client, console: Console, args) -> object:
    body: dict = {}
    if args.nodes:
        body["nodes"] = [n.strip() for n in args.nodes.split(",") if n.strip()]
    if args.pool:
        body["pool"] = args.pool
    if args.count is not None:
        body["count"] = args.count
    answer = client.post(f"models/{quote(args.model, safe='')}/prefetch", body)
    if args.json:
        return answer
    nodes = ", ".join(p["node"] for p in answer["prefetch"])
    console.print(f"prefetching {answer['model']} onto {nodes}")
    console.print(answer["note"])
    return None


def add_model(client: Client, console: Console, args) -> object:
    path = Path(args.file)
    try:
        definition = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise CtlError(f"{path} could not be read: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise CtlError(f"{path} is not valid YAML: {exc}") from None
    if not isinstance(definition, dict):
        raise CtlError(f"{path} must hold one model definition (a mapping with name:, profiles: …)")
    answer = client.post("models", definition)
    warning = client.last_headers.get("X-Llmgw-Warning")
    if args.json:
        return answer
    console.print(f"added {answer['name']}")
    for line in (warning or "").split(" | "):
        if line:
            console.print(show.markup("[yellow]warning:[/] {}", line))
    return None


def remove_model(client: Client, console: Console, args) -> object:
    answer = client.delete(f"models/{quote(args.model, safe='')}")
    if args.json:
        return answer
    console.print(f"removed {answer['removed']}")
    return None


def scale(client: Client, console: Console, args) -> object:
    body: dict = {"min": args.min}
    if args.max is not None:
        body["max"] = args.max
    if args.idle_timeout is not None:
        body["idle_timeout"] = None if args.idle_timeout in ("never", "none", "off") else args.idle_timeout
    answer = client.post(f"models/{quote(args.model, safe='')}/scale", body)
    if args.json:
        return answer
    idle = show.ago(answer["idle_timeout_seconds"]) if "idle_timeout_seconds" in answer else "never"
    demand = " (started on demand)" if answer["on_demand"] else ""
    console.print(f"{answer['model']}: {answer['min']}-{answer['max']} replicas{demand}, idle timeout {idle}")
    return None


def replicas(client: Client, console: Console, args) -> object:
    rows = client.get("replicas", model=args.model)
    if args.json:
        return rows
    t = show.table("REPLICA", "MODEL", "PROFILE", "STATE", "WHERE", "IDLE", "START")
    for r in rows:
        state = show.markup("{} [yellow]stale[/]" if r["stale"] else "{}", r["state"])
        where = " ".join(f"{s['node']}:{','.join(s['gpu_labels']) or 'cpu'}" for s in r["shards"])
        # The download while there is one, then the start's phases (rank 0's: where the API answers).
        download = " ".join(show.fetch(s.get("fetch")) for s in r["shards"] if s.get("fetch"))
        start = download or phases(r["shards"][0] if r["shards"] else {})
        t.add_row(r["id"], r["model"], r["profile"], state, where, show.ago(r["idle_seconds"]), start)
    console.print(t)
    for r in rows:
        if r.get("start"):
            start = r["start"]
            console.print(f"{r['id']}: {start['sentence']} (estimate {start['estimate_s']:.0f} s: {start['basis']})")
        if r.get("error"):
            console.print(show.markup("[red]{}[/] {}", r["id"], r["error"]))
    return None


def phases(shard: dict) -> str:
    """A shard's start in phases, as ``ctl replicas`` shows it: "fetch 3 s (local), load 41 s"."""
    p = shard.get("phases") or {}
    if "fetch_s" not in p:
        return ""
    local = " (local)" if p.get("weights_local") else ""
    out = f"fetch {p['fetch_s']:.0f} s{local}"
    return out + (f", load {p['load_s']:.0f} s" if "load_s" in p else "")


def explain(client: Client, console: Console, args) -> object:
    view = client.get("explain-placement", model=args.model)
    if args.json:
        return view
    console.print(show.markup("[bold]{}[/]: {}", view["model"], "placed" if view["placed"] else "no replica placed"))
    for r in view["rejections"]:
        where = " ".join(x for x in (r.get("pool") and f"pool {r['pool']}", r.get("node")) if x)
        many = f" ({r['nodes']} candidates)" if r.get("nodes", 1) > 1 else ""
        console.print(f"  {r['profile']}{' ' + where if where else ''}: {r['reason']}{many}")
    if view.get("autoscale"):
        _explain_autoscale(console, view["autoscale"])
    for t in view.get("start_timeouts", []):
        console.print(f"  start timed out, {t['at'][:19]}: {t['reason']}")
    if view.get("note"):
        console.print(view["note"])
    return None


def _explain_autoscale(console: Console, a: dict) -> None:
    """The autoscaler's count and reason, the load it read and where from, and its latest changes."""
    console.print(show.markup("autoscale: [bold]{}[/] wanted ({}): {}", a["desired"], a["direction"], a["reason"]))
    load = a["load"]
    ttft = f", first token {load['time_to_first_token_ms']:.0f} ms" if "time_to_first_token_ms" in load else ""
    console.print(
        f"  load from {load['source']} ({load['workers']} gateway workers): in flight {load['in_flight']}, "
        f"waiting {load['waiting']}, {load['tokens_per_second']:.0f} tokens/s{ttft}"
    )
    for e in a.get("history", []):
        console.print(f"  {e['at']}: {e['from']} → {e['to']} ({e['direction']}): {e['reason']}")


def capacity(client: Client, console: Console, args) -> object:
    rows = client.get("capacity")
    if args.json:
        return rows
    t = show.table("MODEL", "PROFILE", "MEASURED", "BY", "FIGURES")
    for c in rows:
        figures = ", ".join(f"{k} {v}" for k, v in c["measurement"].items())
        t.add_row(c["model"], c["profile"], c["measured_at"][:19], c.get("measured_by", ""), figures)
    console.print(t)
    return None


def orphans(client: Client, console: Console, args) -> object:
    answer = client.get("weights/orphans")
    if args.json:
        return answer
    _weights(console, answer)
    if answer["orphans"]:
        console.print("`llmgw ctl collect` asks the agents to delete them")
    return None


def collect(client: Client, console: Console, args) -> object:
    answer = client.post("weights/collect", {"nodes": args.node} if args.node else {})
    if args.json:
        return answer
    _weights(console, answer)
    console.print(f"requested by {answer['requested_by']}; {answer['already_pending']} were already pending")
    console.print(answer["note"])
    return None


def _weights(console: Console, answer: dict) -> None:
    t = show.table("NODE", "PATH", "SIZE")
    for o in answer["orphans"]:
        t.add_row(o["node"], o["path"], show.size(o.get("bytes")))
    console.print(t)
    console.print(f"{answer['weights']} weights on {answer['nodes']} nodes, {show.size(answer['bytes'])}")
