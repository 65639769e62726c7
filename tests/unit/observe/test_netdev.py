"""Interface and RDMA byte counters: units, missing counters, saturation."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from kvlab.core.errors import InputError
from kvlab.observe import netdev


def port(root: Path, dev: str, n: int, files: dict[str, int]) -> None:
    counters = root / dev / "ports" / str(n) / "counters"
    counters.mkdir(parents=True)
    for name, value in files.items():
        (counters / name).write_text(f"{value}\n")


def test_rdma_words_ext_and_saturation(tmp_path: Path) -> None:
    port(tmp_path, "mlx5_0", 1, {"port_rcv_data": 1000, "port_xmit_data": 10})
    port(tmp_path, "mlx5_1", 1, {"port_rcv_data": 5, "port_xmit_data": 5,
                                 "port_rcv_data_ext": 8000, "port_xmit_data_ext": 800})
    port(tmp_path, "qib0", 1, {"port_rcv_data": netdev.SATURATED_32, "port_xmit_data": 0})
    port(tmp_path, "odd0", 1, {"port_rcv_data": 7})  # no xmit counter: skipped
    before = netdev.read_rdma(tmp_path)
    assert set(before) == {"mlx5_0/1", "mlx5_1/1", "qib0/1"}
    assert before["mlx5_0/1"].rx_bytes == 4000 and before["mlx5_0/1"].units == "4-byte words"
    assert before["mlx5_1/1"].rx_bytes == 8000 and before["mlx5_1/1"].units == "bytes (_ext)"
    assert before["qib0/1"].saturated
    (tmp_path / "mlx5_0/ports/1/counters/port_rcv_data").write_text("1250\n")
    after = netdev.read_rdma(tmp_path)
    delta = netdev.rdma_delta(before, after)
    assert delta is not None
    assert delta.ports["mlx5_0/1"].rx_bytes == 1000
    assert delta.rx_bytes == 1000 and delta.tx_bytes == 0
    assert delta.saturated is True


def test_no_infiniband_means_no_rdma(tmp_path: Path) -> None:
    assert netdev.read_rdma(tmp_path / "absent") == {}
    assert netdev.rdma_delta({}, {}) is None


def test_loopback_counters_move_with_traffic() -> None:
    iface = "lo" if "lo" in netdev.interfaces() else "lo0"
    before = netdev.read_iface(iface)
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    conn, _ = server.accept()
    client.sendall(b"x" * 200_000)
    got = 0
    while got < 200_000:
        got += len(conn.recv(65536))
    for s in (client, conn, server):
        s.close()
    rx, tx = netdev.iface_delta(before, netdev.read_iface(iface))
    assert rx is not None and rx >= 200_000 and tx is not None and tx >= 200_000


def test_unknown_interface_is_refused_by_name() -> None:
    assert netdev.read_iface("nosuch9") is None
    assert netdev.iface_delta(None, None) == (None, None)
    with pytest.raises(InputError, match="CLUSTER_IFACE='nosuch9'"):
        netdev.require_iface("nosuch9")
    netdev.require_iface("")  # unset: the seed's "no counters" path
