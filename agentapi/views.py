"""Agent endpoints: registration, full reports, topology scans. Plain Django views, not DRF:
they need nothing from a framework but JSON in and out. The light heartbeat is not
here: the ASGI fast lane (fast.py) is its one path.

Every refusal is ``{"error": "<sentence>"}`` with a 4xx status, and nothing
stored changes: validation happens before the transaction that writes.
"""

from __future__ import annotations

import logging
import math
from datetime import datetime, timedelta

from django.db import IntegrityError, transaction
from django.db.models import Q
from django.http import JsonResponse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from agent.protocol import HEARTBEAT_INTERVAL_S, REPORT_INTERVAL_S
from agentapi.auth import Refused, bearer, check_join_token, node_for_credential
from agentapi.limits import REPORT_LIMIT, too_large, too_soon
from catalog import rules
from core import jsonbody
from core.compiled import CompiledQuery
from core.credentials import hash_token, new_token
from inventory import node_address
from inventory import signals as inventory_signals
from inventory.bounds import report_bounds
from inventory.loss_settings import report_min_interval_s
from inventory.models import Node
from inventory.report_schema import report_problems, unstorable
from inventory.writes import ingest, scans
from inventory.writes.heartbeats import desk
from placement import assignments
from placement.writes.shard_status import node_hosts

log = logging.getLogger(__name__)

# The node a registration names, locked until it commits (core.compiled: built once, not per registration).
_NODE_BY_NAME = CompiledQuery(lambda name: Node.objects.select_for_update().filter(name=name))


def error(status: int, message: str, retry_after_s: int | None = None) -> JsonResponse:
    answer = JsonResponse({"error": message}, status=status)
    if retry_after_s is not None:
        answer["Retry-After"] = str(retry_after_s)
    return answer


def check_length(request, limit: int) -> None:
    length = request.META.get("CONTENT_LENGTH") or ""
    if length.isdigit() and int(length) > limit:
        raise Refused(413, too_large(int(length), limit))


def read_json(request, limit: int):
    """The body as JSON, refusing what is too large before reading it all."""
    check_length(request, limit)
    body = request.read(limit + 1)
    if len(body) > limit:
        raise Refused(413, too_large(None, limit))
    try:
        return jsonbody.loads(body or b"null")
    except jsonbody.BodyError as exc:
        raise Refused(400, str(exc)) from None


def refusals(view):
    def wrapped(request, *args, **kwargs):
        try:
            return view(request, *args, **kwargs)
        except Refused as refused:
            return error(refused.status, refused.message, refused.retry_after_s)

    wrapped.__name__ = view.__name__
    wrapped.__doc__ = view.__doc__
    return csrf_exempt(require_POST(wrapped))


def check_report(report, node: Node | None = None) -> None:
    """Refuse a report the columns cannot hold; a registered node keeps why, for operators to see."""
    problems = report_problems(report, report_bounds())
    if problems:
        message = "the report was not stored: " + "; ".join(problems)
        if node is not None:
            note_report_error(node, message)
        raise Refused(400, message)


def check_address(request, report: dict, node: Node | None = None) -> None:
    """Refuse a report whose engine address the node may not claim (inventory.node_address says which).

    The address checked is the one the gateway would send to (placement's ``node_hosts``: the reported
    address, else the hostname). A registered node whose report keeps the address it has is not
    checked again: the address was checked when it was first stored, and the resolver is spared.
    """
    cols = ingest.node_columns(report)
    claimed = node_hosts(Node(mgmt_addr=cols["mgmt_addr"], hostname=cols["hostname"]))
    if node is not None and claimed == node_hosts(node):
        return
    rules = node_address.address_rules()
    forwarded = request.META.get("HTTP_X_FORWARDED_FOR", "")
    peer = node_address.peer_of(request.META.get("REMOTE_ADDR"), forwarded, rules.trusted_proxies)
    for host in sorted(claimed):
        problem = node_address.address_problem(host, peer, rules)
        if problem:
            message = f"the report was not stored: {problem}"
            if node is not None:
                note_report_error(node, message)
            raise Refused(400, message)


def note_report_error(node: Node, message: str) -> None:
    """Keep (or clear, with "") why the node's last report was refused: it shows on the node's page and in the API."""
    kept = message[: Node._meta.get_field("report_error").max_length]
    if node.report_error != kept:
        Node.objects.filter(pk=node.pk).update(report_error=kept)
        node.report_error = kept


def publish_changes(node: Node, result: ingest.IngestResult) -> None:
    """Tell the apps above what a report changed (inventory's node_reported), once it is committed."""
    if not result.changed:
        return
    transaction.on_commit(lambda: inventory_signals.node_reported.send(sender=Node, node=node, result=result))


@refusals
def register(request):
    """Register a node with a join token; answers its own credential, shown this once.

    The same machine (same ``machine_id``) registering again under its name
    keeps its identity and gets a fresh credential; another machine claiming
    a registered name is refused.
    """
    check_join_token(bearer(request))
    body = read_json(request, REPORT_LIMIT)
    if not isinstance(body, dict):
        raise Refused(400, "the registration must be a JSON object with at least a name")
    problems: list[str] = []
    unstorable({k: v for k, v in body.items() if k != "report"}, "registration", problems)
    if problems:
        raise Refused(400, "the registration was not stored: " + "; ".join(problems))
    name = body.get("name")
    if not isinstance(name, str) or rules.name_problem("node name", name):
        raise Refused(400, rules.name_problem("node name", str(name)) or "name must be a string")
    machine_id = body.get("machine_id") or ""
    if not isinstance(machine_id, str) or len(machine_id) > 64:
        raise Refused(400, "machine_id must be a string of at most 64 characters")
    report = body.get("report")
    if report is not None:
        check_report(report)
        check_address(request, report)
    secret = new_token("llmgw_node")
    now = timezone.now()
    with transaction.atomic():
        node = _NODE_BY_NAME.first(name)  # the name is unique
        if node is not None and (not machine_id or node.machine_id != machine_id):
            raise Refused(
                409,
                f"a different machine is registered as {name!r}; choose another name, or "
                "delete that node in the admin if it is gone",
            )
        created = node is None
        if created:
            node = Node(name=name, machine_id=machine_id, last_seen=now, credential_digest=hash_token(secret))
            try:
                # No savepoint: a name taken meanwhile refuses the whole registration, which rolls back.
                if report is None:
                    node.save(force_insert=True)
                else:
                    publish_changes(node, ingest.ingest_new_node(node, report, now))
            except IntegrityError:
                raise Refused(409, f"{name!r} was registered at the same moment by another request") from None
        else:
            node.credential_digest = hash_token(secret)
            node.last_seen = now
            node.save(update_fields=["credential_digest", "last_seen"])
            if report is not None:
                publish_changes(node, ingest.ingest_report(node, report, now))
        if report is not None:
            note_report_error(node, "")
    desk.remember(node)
    if created:
        transaction.on_commit(lambda: inventory_signals.node_registered.send(sender=Node, node=node))
    return JsonResponse(
        {
            "node": name,
            "credential": secret,
            "heartbeat_interval_s": HEARTBEAT_INTERVAL_S,
            "report_interval_s": REPORT_INTERVAL_S,
        },
        status=201 if created else 200,
    )


@refusals
def report(request):
    """A full discovery report from a registered node."""
    node = node_for_credential(bearer(request))
    body = read_json(request, REPORT_LIMIT)
    check_report(body, node)
    check_address(request, body, node)
    now = timezone.now()
    take_turn(node, now)
    result = ingest.ingest_report(node, body, now)
    note_report_error(node, "")
    desk.remember(node)
    if not result.unchanged:
        publish_changes(node, result)
    answer = {"unchanged": result.unchanged, "changed": result.changed, "shards": assignments.for_node(node.pk)}
    scan = scans.scan_for(node, now)
    if scan:
        answer["scan"] = scan
    return JsonResponse(answer)


def take_turn(node: Node, now: datetime) -> None:
    """Take the node's turn to report, or refuse (429, Retry-After) one sooner than the interval after its last.

    One conditional UPDATE: of reports sent at once, one takes the turn and the others are refused.
    """
    interval = report_min_interval_s()
    if interval <= 0:
        return
    due = Q(last_report_at__isnull=True) | Q(last_report_at__lte=now - timedelta(seconds=interval))
    if Node.objects.filter(due, pk=node.pk).update(last_report_at=now):
        return
    last = Node.objects.filter(pk=node.pk).values_list("last_report_at", flat=True).first() or now
    wait = max(1, math.ceil(interval - (now - last).total_seconds()))
    raise Refused(429, too_soon(interval, wait), retry_after_s=wait)


@refusals
def scan(request):
    """A topology scan's output (or why it failed) from the node that was asked to run it."""
    node = node_for_credential(bearer(request))
    body = read_json(request, scans.SCAN_LIMIT)
    try:
        record = scans.accept_upload(node, body, timezone.now())
    except scans.UploadRefused as refused:
        raise Refused(refused.status, refused.message) from None
    return JsonResponse({"fabric": record.fabric_key, "kept": not record.error, "error": record.error or None})
