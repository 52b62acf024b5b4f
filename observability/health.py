"""``GET /healthz``: versions, and whether each backing service answers.

Answers 200 while the database answers, even when the channel layer or the
broker does not: heartbeats are still stored then, only live pushes and
periodic work wait. 503 means the database itself is unreachable, which is
what a load balancer should take a host out for.
"""

from __future__ import annotations

import platform
import time
from importlib import metadata

import django
from django.conf import settings
from django.db import connection
from django.http import JsonResponse
from django.views.decorators.http import require_GET

from core.models import TaskRun

REDIS_TIMEOUT_S = 1.0
# pyproject.toml is the version's one home; the installed package's metadata carries it.
VERSION = metadata.version("llmgw")


def check_database() -> dict:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return {"ok": True, "engine": connection.vendor}
    except Exception as exc:  # noqa: BLE001 - any failure is the answer
        return {"ok": False, "engine": connection.vendor, "error": str(exc).strip().splitlines()[0][:300]}


def _ping_redis(url: str) -> dict:
    import redis

    try:
        client = redis.Redis.from_url(url, socket_timeout=REDIS_TIMEOUT_S, socket_connect_timeout=REDIS_TIMEOUT_S)
        client.ping()
        return {"ok": True, "kind": "redis"}
    except Exception as exc:  # noqa: BLE001 - any failure is the answer
        return {"ok": False, "kind": "redis", "error": str(exc)[:300]}


def check_channel_layer() -> dict:
    if settings.LLMGW_REDIS_URL:
        return _ping_redis(settings.LLMGW_REDIS_URL)
    return {"ok": True, "kind": "in-memory", "note": "live updates reach this process's pages only"}


def check_broker() -> dict:
    if settings.LLMGW_REDIS_URL:
        return _ping_redis(settings.LLMGW_REDIS_URL)
    folder = settings.CELERY_BROKER_TRANSPORT_OPTIONS["data_folder_in"]
    import os

    ok = os.path.isdir(folder) and os.access(folder, os.W_OK)
    result = {"ok": ok, "kind": "filesystem", "path": folder}
    if not ok:
        result["error"] = f"{folder} is missing or not writable"
    return result


def check_worker() -> dict:
    """When the periodic tick last ran; absent means no worker has run yet."""
    try:
        run = TaskRun.objects.filter(name="observability.tasks.tick").first()
    except Exception:  # noqa: BLE001 - the database check reports this
        return {}
    if run is None or run.last_finished is None:
        return {"last_tick": None}
    return {"last_tick": run.last_finished.isoformat()}


@require_GET
def healthz(request):
    started = time.monotonic()
    body = {
        "status": "ok",
        "listener": getattr(request, "llmgw_listener", "admin"),
        "version": VERSION,
        "django": django.get_version(),
        "python": platform.python_version(),
        "database": check_database(),
        "channel_layer": check_channel_layer(),
        "broker": check_broker(),
        "worker": check_worker(),
    }
    if not all(body[k]["ok"] for k in ("database", "channel_layer", "broker")):
        body["status"] = "degraded"
    body["took_ms"] = round((time.monotonic() - started) * 1000, 1)
    return JsonResponse(body, status=200 if body["database"]["ok"] else 503)
