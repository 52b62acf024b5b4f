"""Settings come from the environment; a value that cannot be used stops start-up with one clear line."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest

from core import config
from llmgw import embedded_db


def load(tmp_path, **env):
    return config.load({"LLMGW_DATA_DIR": str(tmp_path / "data"), **env})


def test_defaults_work_on_one_machine(tmp_path):
    cfg = load(tmp_path)
    assert cfg.database_url is None, "llmgw's own PostgreSQL in the data dir (llmgw.embedded_db)"
    assert cfg.embedded and cfg.redis_url is None
    assert str(cfg.admin_addr) == "127.0.0.1:8000"
    assert str(cfg.gateway_addr) == "127.0.0.1:8080"
    assert cfg.debug is False
    assert cfg.gateway_workers == 1


def test_secret_key_is_generated_once_and_kept_private(tmp_path):
    first = load(tmp_path).secret_key
    assert load(tmp_path).secret_key == first
    mode = stat.S_IMODE(os.stat(tmp_path / "data" / "secret-key").st_mode)
    assert mode == 0o600


def test_secret_key_from_a_file(tmp_path):
    secret = tmp_path / "key"
    secret.write_text("from-a-file\n")
    assert load(tmp_path, LLMGW_SECRET_KEY_FILE=str(secret)).secret_key == "from-a-file"


def test_several_admin_processes_with_redis_and_postgresql(tmp_path):
    cfg = load(
        tmp_path,
        LLMGW_ADMIN_WORKERS="3",
        LLMGW_REDIS_URL="redis://127.0.0.1:6379/0",
        LLMGW_DATABASE_URL="postgresql://u@h/db",
    )
    assert cfg.admin_workers == 3 and load(tmp_path).admin_workers == 1


def test_the_admin_pool_size(tmp_path):
    assert load(tmp_path).admin_db_connections == 10
    assert load(tmp_path, LLMGW_ADMIN_DB_CONNECTIONS="1").admin_db_connections == 1


@pytest.mark.parametrize(
    ("env", "variable", "words"),
    [
        ({"LLMGW_DATABASE_URL": "mysql://x@y/z"}, "LLMGW_DATABASE_URL", "not supported"),
        ({"LLMGW_DATABASE_URL": "postgresql://u@h:notaport/db"}, "LLMGW_DATABASE_URL", "port is not a number"),
        ({"LLMGW_DATABASE_URL": "nonsense"}, "LLMGW_DATABASE_URL", "not supported"),
        ({"LLMGW_REDIS_URL": "http://localhost"}, "LLMGW_REDIS_URL", "redis://"),
        ({"LLMGW_ADMIN_ADDR": "127.0.0.1"}, "LLMGW_ADMIN_ADDR", "no port"),
        ({"LLMGW_ADMIN_ADDR": "127.0.0.1:99999"}, "LLMGW_ADMIN_ADDR", "between 1 and 65535"),
        ({"LLMGW_GATEWAY_ADDR": "127.0.0.1:8000"}, "LLMGW_GATEWAY_ADDR", "same as LLMGW_ADMIN_ADDR"),
        ({"LLMGW_DEBUG": "maybe"}, "LLMGW_DEBUG", "yes/no"),
        ({"LLMGW_GATEWAY_WORKERS": "0"}, "LLMGW_GATEWAY_WORKERS", "from 1 to 256"),
        ({"LLMGW_DATABASE_URL": "postgresql://u@h/db?prepare_threshold=x"}, "LLMGW_DATABASE_URL", "or none"),
        ({"LLMGW_GATEWAY_WORKERS": "two"}, "LLMGW_GATEWAY_WORKERS", "whole number"),
        ({"LLMGW_ADMIN_WORKERS": "65"}, "LLMGW_ADMIN_WORKERS", "from 1 to 64"),
        ({"LLMGW_ADMIN_DB_CONNECTIONS": "0"}, "LLMGW_ADMIN_DB_CONNECTIONS", "from 1 to 1000"),
        ({"LLMGW_ADMIN_DB_CONNECTIONS": "1001"}, "LLMGW_ADMIN_DB_CONNECTIONS", "from 1 to 1000"),
        ({"LLMGW_ADMIN_WORKERS": "2"}, "LLMGW_ADMIN_WORKERS", "needs LLMGW_REDIS_URL"),
        ({"LLMGW_SECRET_KEY_FILE": "/nonexistent/key"}, "LLMGW_SECRET_KEY_FILE", "cannot read"),
    ],
)
def test_bad_values_name_the_variable_and_the_reason(tmp_path, env, variable, words):
    with pytest.raises(config.ConfigError) as info:
        load(tmp_path, **env)
    assert info.value.variable == variable
    assert words in str(info.value)


def test_ipv6_addresses(tmp_path):
    cfg = load(tmp_path, LLMGW_ADMIN_ADDR="[::1]:9000")
    assert cfg.admin_addr.host == "::1" and cfg.admin_addr.port == 9000
    assert cfg.admin_addr.url_host == "[::1]:9000"


def run_llmgw(tmp_path, *args, **env):
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")}
    clean.update({"LLMGW_DATA_DIR": str(tmp_path / "data"), **env})
    return subprocess.run(
        [sys.executable, "-m", "llmgw.cli", *args], env=clean, capture_output=True, text=True, timeout=60
    )


def test_command_prints_one_line_not_a_traceback(tmp_path):
    result = run_llmgw(tmp_path, "serve", LLMGW_DATABASE_URL="mysql://x@y/z")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("llmgw: configuration error: LLMGW_DATABASE_URL:")


def test_unreachable_database_stops_start_up_clearly(tmp_path):
    result = run_llmgw(tmp_path, "serve", LLMGW_DATABASE_URL="postgresql://postgres@127.0.0.1:1/llmgw")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "LLMGW_DATABASE_URL: the database cannot be reached" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_django_commands_also_refuse_bad_values(tmp_path):
    result = run_llmgw(tmp_path, "check", LLMGW_ADMIN_ADDR="nope")
    assert result.returncode == 2
    assert "LLMGW_ADMIN_ADDR" in result.stderr and "Traceback" not in result.stderr


def test_prepared_statements_can_be_turned_off_in_the_database_url():
    assert config.prepare_threshold("none") is None and config.prepare_threshold("5") == 5
    assert config.check_database_url("postgresql://u@h/db?prepare_threshold=none")


PROBE = """
import os, stat, sys
import django
django.setup()
from django.db import connection
with connection.cursor() as cursor:
    cursor.execute("CREATE TABLE probe (x integer)")
    cursor.execute("INSERT INTO probe VALUES (1)")
    print(connection.vendor, connection.settings_dict["NAME"])
"""


def test_the_embedded_database_is_postgresql_in_the_data_dir_and_private_from_creation(tmp_path):
    """Under a umask of 022: PostgreSQL's folder (and the socket in it) is its user's alone, and the data dir
    lets others pass through to it but not list it, even where the wheel opened it as root."""
    data = tmp_path / "data"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_DATABASE")}
    env.update(LLMGW_DATA_DIR=str(data), DJANGO_SETTINGS_MODULE="llmgw.settings")
    probe = subprocess.run(
        [sys.executable, "-c", PROBE],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=lambda: os.umask(0o022),
    )
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.split() == ["postgresql", "llmgw"]
    assert stat.S_IMODE((data / "postgres").stat().st_mode) == 0o700
    assert stat.S_IMODE(data.stat().st_mode) & 0o066 == 0
    assert embedded_db.running_url(data) is None, "the probe was its only user: stopped when it ended"


@pytest.mark.parametrize("url", ["sqlite:///data/llmgw.sqlite3", "mysql://u@h/db"])
def test_a_database_other_than_postgresql_is_refused_with_what_to_do(tmp_path, url):
    with pytest.raises(config.ConfigError, match="leave it unset for the PostgreSQL llmgw runs itself"):
        load(tmp_path, LLMGW_DATABASE_URL=url)


BAD_PERIODIC = [
    ("LLMGW_AUTOSCALE_TARGET", "lots", "'lots' is not a number"),
    ("LLMGW_PARTITION_HOLD_S", "soon", "'soon' is not a number"),
    ("LLMGW_FLAPS_TO_CORDON", "2.5", "'2.5' is not a whole number"),
    ("LLMGW_HEALTH_CORDON_AFTER", "0", "0 is below the least useful value, 1"),
    ("LLMGW_HEALTH_WINDOW_S", "nan", "'nan' is not a finite number"),
]


@pytest.mark.parametrize(("variable", "value", "words"), BAD_PERIODIC)
def test_a_setting_read_by_periodic_work_stops_the_start_not_each_run(tmp_path, variable, value, words):
    """A bad autoscaler, node loss or card health knob is said once at start (and by llmgw check), not by every
    reconcile, reachability sweep or health review."""
    result = run_llmgw(tmp_path, "serve", **{variable: value})
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [f"llmgw: configuration error: {variable}: {words}"]
    checked = run_llmgw(tmp_path, "check", **{variable: value})
    assert checked.returncode != 0 and f"{variable}: {words}" in checked.stderr


@pytest.mark.parametrize(
    ("raw", "low", "high", "words"),
    [
        ("lots", 0.0, None, "'lots' is not a number"),
        ("nan", 0.0, None, "'nan' is not a finite number"),
        ("inf", 0.0, None, "'inf' is not a finite number"),
        ("-1", 0.0, None, "-1 is below the least useful value, 0"),
        ("2", 0.05, 1.0, "2 is outside 0.05..1"),
        ("nan", 0.05, 1.0, "'nan' is not a finite number"),
    ],
)
def test_every_numeric_setting_refuses_the_same_things_in_the_same_words(raw, low, high, words):
    with pytest.raises(config.ConfigError) as info:
        config.number({"LLMGW_X": raw}, "LLMGW_X", 1.0, low=low, high=high)
    assert info.value.variable == "LLMGW_X" and info.value.reason == words


def test_a_numeric_setting_unset_is_its_default_and_set_is_its_value():
    assert config.number({}, "LLMGW_X", 2.5) == 2.5
    assert config.number({"LLMGW_X": " 0.3 "}, "LLMGW_X", 2.5, low=0.05, high=1.0) == 0.3
