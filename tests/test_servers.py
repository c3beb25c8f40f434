"""The test servers' ports: drawn where no outgoing connection can take them before the server binds."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.servers import FIRST_PORT, ephemeral_ports, free_port


def test_a_free_port_is_below_the_kernels_ephemeral_range_and_can_be_bound():
    low, _ = ephemeral_ports()
    for _ in range(50):
        port = free_port()
        assert FIRST_PORT <= port < low
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_a_port_a_listener_holds_is_never_given(monkeypatch):
    with socket.socket() as held:
        held.bind(("127.0.0.1", FIRST_PORT))
        held.listen()
        monkeypatch.setattr("tests.servers.ephemeral_ports", lambda: (FIRST_PORT + 2, 60999))  # two ports to draw from
        for _ in range(10):
            monkeypatch.setattr("tests.servers._GIVEN", set())
            assert free_port() == FIRST_PORT + 1
        with pytest.raises(OSError, match=f"no free TCP port in {FIRST_PORT}..{FIRST_PORT + 1} after 200 draws"):
            free_port()  # the other one was given already


@pytest.mark.parametrize(("text", "expected"), [("40000\t50000\n", (40000, 50000)), ("garbage", (32768, 60999))])
def test_the_ephemeral_range_is_read_from_the_kernel_or_taken_as_linuxs_default(tmp_path: Path, text, expected):
    (tmp_path / "range").write_text(text)
    assert ephemeral_ports(tmp_path / "range") == expected
    assert ephemeral_ports(tmp_path / "missing") == (32768, 60999)


def test_ports_asked_for_one_after_another_are_distinct():
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == 200
