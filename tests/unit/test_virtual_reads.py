"""Virtual range topics, sans-IO: which broker reads a Fetch makes, and when a connection the
broker has not served yet probes instead of reading again what another connection read."""

from __future__ import annotations

from proxy.virtual.fetch import FetchPart, RecentReads, every_share, plan_reads
from proxy.virtual.names import VirtualNames, share_ranges

VT = VirtualNames().parse("t.kr4")
assert VT is not None


def _part(virtual_partition: int, offset: int, *, topic: str = "t.kr4") -> FetchPart:
    return FetchPart(topic=topic, index=virtual_partition, real="t", real_id=None,
                     real_partition=VT.real_partition(virtual_partition),
                     share=(VT.share_range(virtual_partition),), fetch_offset=offset, max_bytes=1 << 20,
                     shares=VT.shares)


def test_one_read_per_real_partition_from_the_lowest_position():
    reads = plan_reads([_part(0, 50), _part(1, 30), _part(4, 7)], set())
    assert sorted((r.partition, r.fetch_offset, len(r.parts), r.probe) for r in reads) == [
        (0, 30, 2, False), (1, 7, 1, False)]


def test_a_partition_whose_parts_are_all_cached_is_probed_at_the_high_watermark():
    recent = RecentReads()
    recent.add(("t", 0), 0, 8890, 200_000)
    parts = [_part(1, 0), _part(2, 100), _part(4, 0)]
    reads = plan_reads(parts, set(), lambda p: recent.probe_offset((p.real, p.real_partition), p.fetch_offset))
    by_partition = {r.partition: r for r in reads}
    assert by_partition[0].probe and by_partition[0].fetch_offset == 200_000
    assert not by_partition[1].probe and by_partition[1].fetch_offset == 0  # nothing read there yet


def test_one_part_outside_the_recent_reads_makes_the_partition_a_real_read():
    recent = RecentReads()
    recent.add(("t", 0), 0, 8890, 200_000)
    parts = [_part(1, 0), _part(2, 9000)]
    (read,) = plan_reads(parts, set(), lambda p: recent.probe_offset((p.real, p.real_partition), p.fetch_offset))
    assert not read.probe and read.fetch_offset == 0 and len(read.parts) == 2


def test_recent_reads_cover_their_stretches_and_stay_bounded():
    recent = RecentReads(per_partition=2, max_partitions=2)
    assert recent.probe_offset(("t", 0), 0) is None
    recent.add(("t", 0), 0, 100, 500)
    recent.add(("t", 0), 100, 200, 600)
    assert recent.probe_offset(("t", 0), 99) == 600  # the newest high watermark
    assert recent.probe_offset(("t", 0), 200) is None  # not read yet
    recent.add(("t", 0), 200, 300, 700)  # the oldest stretch goes
    assert recent.probe_offset(("t", 0), 50) is None and recent.probe_offset(("t", 0), 250) == 700
    recent.add(("t", 0), 300, None, 800)  # a read with no complete batch covers nothing
    assert recent.probe_offset(("t", 0), 300) is None and recent.probe_offset(("t", 0), 250) == 800
    recent.add(("u", 0), 0, 10, 10)
    recent.add(("v", 0), 0, 10, 10)  # a third partition: the least recently read one goes
    assert recent.probe_offset(("t", 0), 250) is None and recent.probe_offset(("v", 0), 5) == 10


def test_every_share_of_the_virtual_topics_read():
    parts = [_part(1, 0), _part(2, 0)]
    assert every_share(parts) == [(share,) for share in share_ranges(4)]
    real = FetchPart(topic="t", index=0, real="t", real_id=None, real_partition=0, share=None, fetch_offset=0,
                     max_bytes=1)
    assert every_share([real]) == []


def test_a_position_at_the_last_high_watermark_is_at_the_log_end():
    recent = RecentReads()
    assert not recent.at_log_end(("t", 0), 0)  # nothing read yet: the first read is worth waiting for
    recent.add(("t", 0), 0, 100, 120)
    assert not recent.at_log_end(("t", 0), 100) and recent.at_log_end(("t", 0), 120)
