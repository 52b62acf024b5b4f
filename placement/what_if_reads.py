"""What-if questions asked of the stored fleet: what would move, what would fall short, if these parts were lost.

The answer is placement.what_if's (pure), worked out on a snapshot of the
fleet read here; the parts may be named by node, NVLink domain, label or
fabric. The API (``POST /api/v1/what-if``) and the console's NVLink page ask it.
"""

from __future__ import annotations

from dataclasses import asdict
from datetime import datetime
from typing import Any

from django.utils import timezone

from inventory.devices import mig_label
from inventory.fabric_inventory import analyze_inventory
from inventory.fabrics import FabricReport
from inventory.models import Node, NVLinkDomain
from placement import snapshot as snap
from placement.moves import moves_per_minute
from placement.reads import _rejection
from placement.scheduling import what_if as what_if_model

# --- what if these parts were lost --------------------------------------------------------

# More targets than this in one question is a script gone wrong, not a maintenance plan.
MAX_TARGETS = 200


class WhatIfRefused(ValueError):
    """A what-if question that cannot be answered, in the sentence an operator reads."""


def what_if(lose: list[str], now: datetime | None = None) -> dict[str, Any]:
    """The scheduler's answer if the parts ``lose`` names were lost now; writes nothing.

    ``lose`` holds targets as given (several, or comma-separated in one); each
    is a node's name, an NVLink domain's key or name, an InfiniBand fabric's
    key, id or declared name, or ``LABEL=VALUE``. :class:`WhatIfRefused` when
    none is given, too many are, or one names nothing (the sentence names it).
    """
    texts = what_if_model.split_targets(lose)
    if not texts:
        raise WhatIfRefused("say what to lose: ?lose=NODE, an NVLink domain, a fabric or LABEL=VALUE")
    if len(texts) > MAX_TARGETS:
        raise WhatIfRefused(f"{len(texts)} targets is more than the {MAX_TARGETS} one question may name")
    # One fabric analysis for both the snapshot and the fabrics' other names: it is most of the read.
    fabrics = analyze_inventory()
    loaded = snap.load(now or timezone.now(), fabrics=fabrics)
    try:
        targets = what_if_model.resolve(texts, loaded.snapshot, _target_aliases(fabrics))
    except what_if_model.UnknownTarget as exc:
        if Node.objects.filter(name=exc.target, lost=True).exists():
            raise WhatIfRefused(f"node {exc.target!r} is lost already: nothing of it is left to lose") from None
        raise WhatIfRefused(exc.message) from None
    return what_if_view(what_if_model.what_if(loaded.snapshot, targets, moves_per_minute()))


def _target_aliases(fabrics: FabricReport) -> dict[str, tuple[str, str]]:
    """Other names for domains and fabrics, each to (kind, key): a domain's name, a fabric's id or label."""
    out: dict[str, tuple[str, str]] = {}
    for fabric in fabrics.physical:
        for name in (fabric.id, fabric.label, *fabric.declared):
            if name and name != fabric.key:
                out.setdefault(name, (what_if_model.FABRIC, fabric.key))
    for domain in NVLinkDomain.objects.exclude(name=""):
        out[domain.name] = (what_if_model.NVLINK_DOMAIN, domain.key)
    return out


def what_if_view(answer: what_if_model.WhatIf) -> dict[str, Any]:
    """The what-if answer as the API and the console show it."""
    return {
        "lose": [{"target": t.text, "kind": t.kind, "key": t.key, "nodes": list(t.nodes)} for t in answer.targets],
        "lost_nodes": list(answer.lost),
        "stopped": [_move_view(m) for m in answer.moves],
        "short": [_short_view(s) for s in answer.short],
        "moves": {
            "count": answer.placed,
            "per_minute": answer.moves_per_minute,
            "minutes": answer.move_minutes,
        },
        "note": _what_if_note(answer),
    }


def _move_view(m: what_if_model.Move) -> dict[str, Any]:
    r = m.replica
    view: dict[str, Any] = {
        "replica": r.id,
        "model": r.model,
        "profile": r.profile,
        "state": r.state,
        "nodes": [s.node for s in r.shards],
        "lost_nodes": list(m.lost_nodes),
        "needed": m.needed,
    }
    if m.new is not None:
        to: dict[str, Any] = {
            "profile": m.new.profile,
            "nodes": list(m.new.nodes),
            "shards": [
                {"node": s.node, "gpus": list(s.gpus), "gpu_labels": [mig_label(i) for i in s.gpus]}
                for s in m.new.shards
            ],
            "interconnect": m.interconnect,
        }
        for key, value in (("nvlink_domain", m.new.nvlink_domain), ("fabric", m.new.fabric), ("pool", m.new.pool)):
            if value:
                to[key] = value
        view["to"] = to
    else:
        view["why"] = m.why
    return view


def _short_view(s: what_if_model.Short) -> dict[str, Any]:
    return {
        "model": s.model,
        "wanted": s.wanted,
        "after": s.after,
        "short_today": s.short_today,
        "parked": s.parked,
        "reasons": [_rejection(asdict(r)) for r in s.reasons],
    }


def _what_if_note(answer: what_if_model.WhatIf) -> str:
    lost = len(answer.lost)
    stops = len(answer.moves)
    if not stops:
        return f"Losing {lost} node{'s' * (lost != 1)} would stop no replica."
    short = len(answer.short)
    moved = (
        f"{answer.placed} would be placed elsewhere within {answer.move_minutes} min "
        f"at {answer.moves_per_minute} moves a minute"
        if answer.placed
        else "none would be placed elsewhere"
    )
    tail = f"; {short} model{'s' * (short != 1)} would be short." if short else "."
    return f"Losing {lost} node{'s' * (lost != 1)} would stop {stops} replica{'s' * (stops != 1)}; {moved}{tail}"
