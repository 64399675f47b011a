"""Which worker listens on which node port, and what every worker advertises for it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.pipeline.cluster import ClusterView
from proxy.server.addresses import AddressBook, NodePlacement, UnmappedNodeError
from proxy.server.workers import reserve_block


@given(st.integers(min_value=1, max_value=16), st.integers(min_value=0, max_value=10_000))
def test_exactly_one_worker_serves_each_node(count, node_id):
    serving = [index for index in range(count) if NodePlacement(index, count).serves(node_id)]
    assert serving == [node_id % count]


def test_an_index_outside_the_workers_is_refused():
    with pytest.raises(ValueError, match="outside 0..1"):
        NodePlacement(2, 2)


def _book(placement: NodePlacement, base: int, opened: list) -> AddressBook:
    return AddressBook(ClusterView(), topology="port-per-broker", advertised_host="127.0.0.1",
                       listen_host="127.0.0.1", node_port_base=base, own_port=base - 1, reuse_port=True,
                       placement=placement, on_new_listener=opened.append)


def _free_base(nodes: int) -> int:
    held, base = reserve_block("127.0.0.1", nodes - 1)
    for sock in held:
        sock.close()
    return base


def test_each_worker_listens_on_its_own_nodes_and_advertises_them_all():
    base = _free_base(4)
    opened: list[list] = [[], []]
    books = [_book(NodePlacement(index, 2), base, opened[index]) for index in range(2)]
    try:
        for node_id in range(4):
            addresses = {book.advertised(node_id) for book in books}
            assert addresses == {("127.0.0.1", base + node_id)}  # both say the same
        assert [listener.node_id for listener in opened[0]] == [0, 2]
        assert [listener.node_id for listener in opened[1]] == [1, 3]
    finally:
        for listener in opened[0] + opened[1]:
            listener.sock.close()


def test_a_worker_cannot_advertise_a_port_the_system_would_pick():
    book = _book(NodePlacement(0, 2), 0, [])
    with pytest.raises(UnmappedNodeError, match="fixed node.port.base"):
        book.advertised(1)
