"""Django settings, built from :mod:`core.config` (the environment).

Nothing here is a fixed secret or a debug default: the secret key is generated
once into the data dir, DEBUG is off unless LLMGW_DEBUG says otherwise.
"""

from __future__ import annotations

import os

import dj_database_url

from core import config as llmgw_config
from llmgw import channel_layers, embedded_db

CONFIG = llmgw_config.load()

BASE_DIR = CONFIG.data_dir
DATA_DIR = CONFIG.data_dir
SECRET_KEY = CONFIG.secret_key
DEBUG = CONFIG.debug
ALLOWED_HOSTS = list(CONFIG.allowed_hosts)
LLMGW_ADMIN_ADDR = CONFIG.admin_addr
LLMGW_GATEWAY_ADDR = CONFIG.gateway_addr
LLMGW_REDIS_URL = CONFIG.redis_url
LLMGW_CATALOG_FILE = CONFIG.catalog_file

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_prometheus",
    "rest_framework",
    "drf_spectacular",
    "channels",
    "core",
    "api",
    "observability",
    "inventory",
    "catalog",
    "placement",
    "dashboard",
    "gateway",
]

MIDDLEWARE = [
    "django_prometheus.middleware.PrometheusBeforeMiddleware",
    # Below the metrics (a 503 is counted as one) and above everything that may query the database.
    "core.errors.DatabaseDownMiddleware",
    "llmgw.listeners.GatewayListenerMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_prometheus.middleware.PrometheusAfterMiddleware",
]

ROOT_URLCONF = "llmgw.urls"
GATEWAY_URLCONF = "llmgw.urls_gateway"
ASGI_APPLICATION = "llmgw.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# PostgreSQL is llmgw's one database: the operator's (LLMGW_DATABASE_URL), or one llmgw runs itself in
# the data dir, started here when this process is the first to need it (llmgw.embedded_db).
DATABASE_URL = CONFIG.database_url or embedded_db.url(CONFIG.data_dir)
# The processes this one starts (serve's gateway and admin processes, its Celery worker) use the
# same server without registering as its users: they end before this process, which stops it.
os.environ["LLMGW_DATABASE_URL"] = DATABASE_URL
DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=60, conn_health_checks=True)}
# django-prometheus's wrapper of the same backend counts queries and errors for /metrics.
DATABASES["default"]["ENGINE"] = "django_prometheus.db.backends.postgresql"
DATABASES["default"].setdefault("OPTIONS", {})["connect_timeout"] = 5
# From the URL's query it is a string; Django and psycopg want a number or None.
if "prepare_threshold" in DATABASES["default"]["OPTIONS"]:
    DATABASES["default"]["OPTIONS"]["prepare_threshold"] = llmgw_config.prepare_threshold(
        DATABASES["default"]["OPTIONS"]["prepare_threshold"]
    )
# Several test runs can share one server (parallel worktrees, CI beside a
# developer): each names its own test database.
DATABASES["default"].setdefault("TEST", {})["NAME"] = os.environ.get("LLMGW_TEST_DB_NAME", "llmgw_test")

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

# Messages live in the session, never in a cookie of their own: the one that shows a secret just minted (an
# API token, a gateway key, a join token) would send it back signed, not encrypted, in Set-Cookie, to every
# proxy between an admin on plain HTTP and the browser
# (tests/core/test_admin_secrets.py::test_a_minted_secret_is_shown_on_the_page_and_never_set_in_a_cookie).
MESSAGE_STORAGE = "django.contrib.messages.storage.session.SessionStorage"

STATIC_URL = "static/"
STATIC_ROOT = DATA_DIR / "static"
LOGIN_URL = "admin:login"

# Requests from agents and the API are bounded so that a runaway client cannot
# make the server hold an arbitrary body in memory.
DATA_UPLOAD_MAX_MEMORY_SIZE = 4 * 1024 * 1024

if CONFIG.redis_url:
    CHANNEL_LAYERS = channel_layers.redis_layer(CONFIG.redis_url)
    CELERY_BROKER_URL = CONFIG.redis_url
    CELERY_BROKER_TRANSPORT_OPTIONS: dict = {"visibility_timeout": 300}
    # A worker takes a task from Redis only when a pool process is free to start it. Prefetched, a task waits
    # in the worker's memory while Redis holds it as taken; if that worker's host dies, the task comes back
    # only after the visibility timeout, long after a periodic task has expired: its period's run is lost
    # (tests/core/test_worker_guard.py::test_a_task_waits_in_redis_not_in_a_busy_worker_so_its_death_loses_nothing).
    # Every task here is periodic or a canary, so the round trip a prefetch saves is nothing to them.
    CELERY_WORKER_DISABLE_PREFETCH = True
else:
    # The in-memory layer reaches only this process, which is why the embedded
    # worker runs inside the ASGI process (see llmgw.serve).
    CHANNEL_LAYERS = channel_layers.in_memory_layer()
    _broker = DATA_DIR / "broker"
    for _sub in ("queue", "processed", "control"):
        (_broker / _sub).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_URL = "filesystem://"
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_broker / "queue"),
        "data_folder_out": str(_broker / "queue"),
        "processed_folder": str(_broker / "processed"),
        # Its exchange tables; left out, kombu writes them to a relative "control/"
        # in whatever folder llmgw was started from.
        "control_folder": str(_broker / "control"),
        "store_processed": False,
    }

CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_IGNORE_RESULT = True
CELERY_BEAT_SCHEDULE_FILENAME = str(DATA_DIR / "celerybeat-schedule")
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
# Each worker also consumes a queue of its own (<name>.dq2), where llmgw.worker_guard sends it its canaries.
CELERY_WORKER_DIRECT = True

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "core.auth.BearerTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["core.auth.DoorPermission"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "core.errors.exception_handler",
    "UNAUTHENTICATED_USER": None,
}

SPECTACULAR_SETTINGS = {
    "TITLE": "llmgw admin API",
    "DESCRIPTION": "The control plane's management API, read by `llmgw ctl`.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_PERMISSIONS": ["rest_framework.permissions.IsAuthenticated"],
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    # Celery's and kombu's retries at a lost broker are one line when it goes and one when it is back.
    "filters": {"outages": {"()": "core.outage.BrokerLogFilter"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain", "filters": ["outages"]}},
    "root": {"handlers": ["console"], "level": "INFO"},
    "loggers": {
        "django.channels.server": {"level": "WARNING"},
        "daphne": {"level": "WARNING"},
        "celery": {"level": "WARNING"},
        # The filesystem broker has no host, and kombu warns about it at every start.
        "kombu.connection": {"level": "ERROR"},
    },
}
