"""llmgw.listener_processes.listen: one socket a process, and the kernel's even share of connections over them."""

from __future__ import annotations

import errno
import select
import socket
import sys

import pytest

from llmgw.listener_processes import ListenerProcesses, listen

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SO_REUSEPORT spreads load on Linux")


def close(socks) -> None:
    for sock in socks:
        sock.close()


def accepted_by_each(socks, connections: int) -> list[int]:
    """How many of ``connections`` fresh connections to the group each socket was handed."""
    port = socks[0].getsockname()[1]
    clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(connections)]
    counts = [0] * len(socks)
    try:
        for i, sock in enumerate(socks):
            while select.select([sock], [], [], 0.2)[0]:
                conn, _ = sock.accept()
                conn.close()
                counts[i] += 1
    finally:
        close(clients)
    return counts


def test_several_processes_get_a_socket_each_on_one_port_and_an_even_share_of_connections():
    socks = listen("127.0.0.1", 0, 3)
    try:
        assert len({s.fileno() for s in socks}) == 3 and len({s.getsockname() for s in socks}) == 1
        assert all(s.get_inheritable() for s in socks)
        counts = accepted_by_each(socks, 60)
        # All opened before any is accepted, as a burst of kept connections is: none got them all.
        # By the hash, a socket gets fewer than 5 of 60 by a chance under one in a million.
        assert sum(counts) == 60 and min(counts) >= 5, counts
    finally:
        close(socks)


def test_one_process_gets_one_socket_without_reuseport():
    (sock,) = listen("127.0.0.1", 0, 1)
    try:
        assert not sock.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT)
    finally:
        sock.close()


@pytest.mark.parametrize("taken_by", [1, 2])
@pytest.mark.parametrize("count", [1, 2])
def test_an_address_another_server_listens_on_is_refused_not_shared(taken_by, count):
    """A second llmgw serve on the same address must not join the first's group and take half its connections."""
    first = listen("127.0.0.1", 0, taken_by)
    try:
        port = first[0].getsockname()[1]
        with pytest.raises(OSError) as refused:
            close(listen("127.0.0.1", port, count))
        assert refused.value.errno == errno.EADDRINUSE
        assert sum(accepted_by_each(first, 4)) == 4, "the first server still takes every connection"
    finally:
        close(first)


def test_processes_and_sockets_must_pair_up():
    socks = listen("127.0.0.1", 0, 2)
    try:
        with pytest.raises(ValueError, match="2 sockets for 3 admin processes"):
            ListenerProcesses(socks, 3, "llmgw.admin_server", "admin")
        assert ListenerProcesses(socks[:1], 3, "llmgw.admin_server", "admin").socks == socks[:1]
    finally:
        close(socks)
