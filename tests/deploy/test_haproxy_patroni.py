"""deploy/haproxy, deploy/patroni, deploy/etcd and deploy/llmgw.env: accepted by their own tools, and agreeing.

HAProxy's own check (``haproxy -c``), Patroni's (``patroni --validate-config``,
which also wants every etcd host to answer and its ports free: it runs in a
network namespace of its own holding the three example addresses, with a
real etcd on them), etcd's flags; then what must agree between the files:
the health checks, the ports, the addresses.
"""

from __future__ import annotations

import json
import re
import subprocess
from urllib.parse import urlsplit

import pytest
import yaml

from core.failover import DATABASE_RETRY_AFTER_S
from tests.deploy.tools import DEPLOY, ensure, env_file

HAPROXY = DEPLOY / "haproxy" / "haproxy.cfg"
PATRONI = DEPLOY / "patroni" / "patroni.yml"
ETCD = DEPLOY / "etcd" / "etcd.env"
LLMGW_ENV = DEPLOY / "llmgw.env"


def sections(text: str) -> dict[str, list[str]]:
    """HAProxy's sections (``listen postgres``, ``backend llmgw_admin``…) and their lines."""
    found: dict[str, list[str]] = {}
    current = None
    for raw in text.splitlines():
        line = raw.split("#")[0].rstrip()
        if not line.strip():
            continue
        if not raw.startswith((" ", "\t")):
            current = line.strip()
            found[current] = []
        elif current:
            found[current].append(line.strip())
    return found


def servers(lines: list[str]) -> list[str]:
    return [line.split()[2] for line in lines if line.startswith("server ")]


def test_haproxy_accepts_the_configuration():
    haproxy = ensure("haproxy", "haproxy")
    done = subprocess.run([haproxy, "-c", "-f", str(HAPROXY)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_haproxy_finds_a_broken_configuration(tmp_path):
    haproxy = ensure("haproxy", "haproxy")
    broken = tmp_path / "haproxy.cfg"
    broken.write_text(HAPROXY.read_text().replace("balance leastconn", "balance fewest"))
    done = subprocess.run([haproxy, "-c", "-f", str(broken)], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "balance only supports" in done.stdout + done.stderr


def test_postgres_goes_to_the_patroni_leader_only():
    """Checked on Patroni's REST API (/primary answers 200 on the leader alone), on the port Patroni listens on."""
    pg = sections(HAPROXY.read_text())["listen postgres"]
    assert "mode tcp" in pg
    assert re.search(r"^option httpchk GET /(primary|leader)$", "\n".join(pg), re.M)
    assert "http-check expect status 200" in pg
    rest_port = PATRONI_CONFIG["restapi"]["listen"].rsplit(":", 1)[1]
    checked = [line for line in pg if line.startswith("server ")]
    assert len(checked) == 3 and all(f"check port {rest_port}" in line for line in checked)
    pg_port = PATRONI_CONFIG["postgresql"]["listen"].rsplit(":", 1)[1]
    assert {s.rsplit(":", 1)[1] for s in servers(pg)} == {pg_port}
    assert "on-marked-down shutdown-sessions" in " ".join(pg), "connections to a demoted leader are cut"


def test_both_llmgw_listeners_of_every_host_are_health_checked_on_healthz():
    found = sections(HAPROXY.read_text())
    env = env_file(LLMGW_ENV)
    listeners = (("backend llmgw_admin", "LLMGW_ADMIN_ADDR"), ("backend llmgw_gateway", "LLMGW_GATEWAY_ADDR"))
    for backend, variable in listeners:
        lines = found[backend]
        assert "option httpchk GET /healthz" in lines and "http-check expect status 200" in lines
        hosts = servers(lines)
        assert len(hosts) == 3 and all(line.endswith(" check") for line in lines if line.startswith("server "))
        assert env[variable] in hosts, f"{variable} of the example host is one HAProxy balances to"
        assert {h.rsplit(":", 1)[1] for h in hosts} == {env[variable].rsplit(":", 1)[1]}


def test_heartbeats_go_to_every_living_host_whatever_its_database():
    """The heartbeat lane takes beats from memory while the database fails over: its hosts are checked on it."""
    found = sections(HAPROXY.read_text())
    assert "use_backend llmgw_heartbeat if { path /api/v1/agent/heartbeat }" in found["frontend llmgw_admin"]
    lines = found["backend llmgw_heartbeat"]
    # A GET on the lane is answered 405 by the process itself (agentapi.fast), touching no database.
    assert "option httpchk GET /api/v1/agent/heartbeat" in lines and "http-check expect status 405" in lines
    assert servers(lines) == servers(found["backend llmgw_admin"])


def test_haproxy_own_503_says_why_and_when_to_come_back():
    """No host able to take a request (a failover): HAProxy answers 503 with a sentence and Retry-After."""
    found = sections(HAPROXY.read_text())
    for backend in ("backend llmgw_admin", "backend llmgw_heartbeat", "backend llmgw_gateway"):
        (line,) = [line for line in found[backend] if line.startswith("http-error status 503 ")]
        body = re.search(r"string '(.*)'", line).group(1)
        wait = DATABASE_RETRY_AFTER_S
        assert f"try again in {wait} s" in body and line.endswith(f"hdr Retry-After {wait}"), line
        json.loads(body)


def test_llmgw_reaches_the_database_through_haproxy():
    url = urlsplit(env_file(LLMGW_ENV)["LLMGW_DATABASE_URL"])
    pg = sections(HAPROXY.read_text())["listen postgres"]
    assert f"bind *:{url.port}" in pg and url.hostname == "127.0.0.1"
    patroni = urlsplit(env_file(LLMGW_ENV)["LLMGW_PATRONI_URL"])
    assert str(patroni.port) == PATRONI_CONFIG["restapi"]["listen"].rsplit(":", 1)[1]


PATRONI_CONFIG = yaml.safe_load(PATRONI.read_text())

VALIDATE = r"""
set -e
ip link set lo up
for h in $HOSTS; do ip addr add "$h/32" dev lo; done
d=$(mktemp -d)
etcd --data-dir "$d/data" --listen-client-urls "$CLIENT_URLS" --advertise-client-urls "${CLIENT_URLS%%,*}" \
  --listen-peer-urls http://127.0.0.1:2380 >"$d/log" 2>&1 &
etcd_pid=$!
trap 'kill $etcd_pid; wait $etcd_pid 2>/dev/null || true; rm -rf "$d"' EXIT
for i in $(seq 100); do (echo > /dev/tcp/${LAST%:*}/${LAST#*:}) 2>/dev/null && break; sleep 0.1; done
patroni --validate-config "$1"
"""


def validate_patroni(path) -> subprocess.CompletedProcess:
    ensure("patroni", "patroni")
    ensure("etcd", "etcd-server")
    ensure("unshare", "util-linux")
    ensure("ip", "iproute2")
    hosts = PATRONI_CONFIG["etcd3"]["hosts"].split(",")
    env = {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOSTS": " ".join(h.rsplit(":", 1)[0] for h in hosts),
        "CLIENT_URLS": ",".join(f"http://{h}" for h in hosts),
        "LAST": hosts[-1],
    }
    probe = subprocess.run(["unshare", "-n", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"no network namespace for Patroni's check (it needs the example's etcd hosts): {probe.stderr}")
    return subprocess.run(
        ["unshare", "-n", "bash", "-c", VALIDATE, "validate", str(path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_patroni_validates_the_configuration():
    done = validate_patroni(PATRONI)
    assert done.returncode == 0, done.stdout + done.stderr


def test_patroni_finds_a_broken_configuration(tmp_path):
    broken = tmp_path / "patroni.yml"
    broken.write_text(PATRONI.read_text().replace("ttl: 30", "ttl: thirty"))
    done = validate_patroni(broken)
    assert done.returncode != 0 and "ttl" in done.stdout + done.stderr


def test_a_committed_write_survives_losing_the_leader():
    """Synchronous replication: a commit waits for a standby."""
    assert PATRONI_CONFIG["bootstrap"]["dcs"]["synchronous_mode"] is True


def test_etcd_takes_every_setting_and_patroni_asks_its_three_members():
    etcd = ensure("etcd", "etcd-server")
    flags = subprocess.run([etcd, "--help"], capture_output=True, text=True, timeout=60)
    known = flags.stdout + flags.stderr
    settings = env_file(ETCD)
    for name in settings:
        assert name.startswith("ETCD_")
        flag = "--" + name.removeprefix("ETCD_").lower().replace("_", "-")
        assert re.search(rf"^\s*{re.escape(flag)}\b", known, re.M), f"{name} is no etcd setting"
    members = [urlsplit(u.split("=", 1)[1]).hostname for u in settings["ETCD_INITIAL_CLUSTER"].split(",")]
    asked = [h.rsplit(":", 1)[0] for h in PATRONI_CONFIG["etcd3"]["hosts"].split(",")]
    assert members == asked and len(members) == 3
    assert settings["ETCD_ADVERTISE_CLIENT_URLS"] == f"http://{asked[0]}:2379"
