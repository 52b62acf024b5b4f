"""What a client is told while the database fails over: pure, so the gateway's pure rules can word it too."""

from __future__ import annotations

DATABASE_RETRY_AFTER_S = 5
"""What a 503 for an unreachable database tells a client to wait: about one Patroni loop, in which a
switchover completes and a failover has begun (docs/operations.md has the figures measured).
deploy/haproxy/haproxy.cfg's own 503s say the same (tests/deploy/test_haproxy_patroni.py checks)."""
