"""ctl commands for the gateway's tenancy: API keys, budgets and usage (served by the gateway piece's endpoints)."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from urllib.parse import quote

from rich.console import Console

from llmgw.ctl import show
from llmgw.ctl.client import Client, CtlError

MICROS = 1_000_000


def keys_create(client: Client, console: Console, args) -> object:
    body: dict = {"team": args.team}
    if args.org:
        body["org"] = args.org
    if args.models:
        body["models"] = [m.strip() for m in args.models.split(",") if m.strip()]
    answer = client.post("keys", body)
    if args.json:
        return answer
    console.print(answer["key"], highlight=False, soft_wrap=True)
    console.print(
        show.markup("[dim]key {} for team {}; shown once, it cannot be read back[/]", answer["prefix"], answer["team"])
    )
    return None


def keys_list(client: Client, console: Console, args) -> object:
    rows = client.get("keys")
    if args.json:
        return rows
    t = show.table("ID", "PREFIX", "TEAM", "ORG", "MODELS", "CREATED", "REVOKED")
    for k in rows:
        models = ", ".join(k["models"]) if k.get("models") is not None else "all"
        t.add_row(
            str(k["id"]),
            k["prefix"],
            k["team"],
            k.get("org") or "",
            models,
            (k.get("created_at") or "")[:19],
            (k.get("revoked_at") or "")[:19],
        )
    console.print(t)
    return None


def keys_revoke(client: Client, console: Console, args) -> object:
    answer = client.post(f"keys/{quote(str(args.id), safe='')}/revoke")
    if args.json:
        return answer
    console.print(f"revoked {answer['id']} at {answer['revoked_at']}")
    return None


def amount_micros(text: str) -> int:
    """'100', '12.50' or '$5' in currency units, as micros; refused when it is not a positive amount."""
    try:
        value = Decimal(text.strip().lstrip("$").replace(",", ""))
    except InvalidOperation:
        raise CtlError(f"the amount must be a number of currency units, like 100 or 12.50 (got {text!r})") from None
    if not value.is_finite() or value < 0:
        raise CtlError(f"the amount must be zero or more (got {text!r})")
    return int(value * MICROS)


def budgets_set(client: Client, console: Console, args) -> object:
    body = {"scope": args.scope, "name": args.name, "amount_micros": amount_micros(args.amount), "period": args.period}
    answer = client.put("budgets", body)
    if args.json:
        return answer
    console.print(f"{answer['scope']} {answer['name']}: {_money(answer['amount_micros'])} a {answer['period']}")
    return None


def budgets_list(client: Client, console: Console, args) -> object:
    rows = client.get("budgets")
    if args.json:
        return rows
    t = show.table("SCOPE", "NAME", "BUDGET", "PERIOD", "SPENT", "USED")
    for b in rows:
        spent = b.get("spent_micros")
        used = f"{spent * 100 / b['amount_micros']:.0f}%" if spent is not None and b["amount_micros"] else "-"
        t.add_row(b["scope"], b["name"], _money(b["amount_micros"]), b["period"], _money(spent), used)
    console.print(t)
    return None


def usage(client: Client, console: Console, args) -> object:
    rows = client.get("usage", by=args.by, since=args.since)
    if args.json:
        return rows
    t = show.table(args.by.upper(), "REQUESTS", "PROMPT", "COMPLETION", "COST", "ERRORS", "BUDGET", "LAST")
    for u in rows:
        budget = "-"
        if u.get("budget_micros") is not None:
            share = f" ({u['fraction'] * 100:.0f}%)" if u.get("fraction") is not None else ""
            budget = f"{_money(u['budget_micros'])}/{u.get('budget_period', '?')}{share}"
        t.add_row(
            u.get("name") or str(u.get("id", "")),
            str(u["requests"]),
            str(u["prompt_tokens"]),
            str(u["completion_tokens"]),
            _money(u["cost_micros"]),
            str(u["errors"]),
            budget,
            (u.get("last_at") or "")[:19],
        )
    console.print(t)
    return None


def _money(micros: int | None) -> str:
    return "-" if micros is None else f"{Decimal(micros) / MICROS:.2f}"
