"""Virtual range topics, sans-IO: which broker reads a Fetch makes, when a connection the
broker has not served yet probes instead of reading again what another connection read, and
which shares an OFFSET_OUT_OF_RANGE answer belongs to."""

from __future__ import annotations

from proxy.virtual.fetch import FetchPart, OutOfRange, RecentReads, every_share, plan_reads
from proxy.virtual.names import VirtualNames, share_ranges

VT = VirtualNames().parse("t.kr4")
assert VT is not None
READ_UNCOMMITTED, READ_COMMITTED = 0, 1


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
    recent.add(("t", 0), 0, 8890, 200_000, READ_UNCOMMITTED)
    parts = [_part(1, 0), _part(2, 100), _part(4, 0)]
    reads = plan_reads(parts, set(), lambda p: recent.probe_offset((p.real, p.real_partition), p.fetch_offset,
                                                                   READ_UNCOMMITTED))
    by_partition = {r.partition: r for r in reads}
    assert by_partition[0].probe and by_partition[0].fetch_offset == 200_000
    assert not by_partition[1].probe and by_partition[1].fetch_offset == 0  # nothing read there yet


def test_one_part_outside_the_recent_reads_makes_the_partition_a_real_read():
    recent = RecentReads()
    recent.add(("t", 0), 0, 8890, 200_000, READ_UNCOMMITTED)
    parts = [_part(1, 0), _part(2, 9000)]
    (read,) = plan_reads(parts, set(), lambda p: recent.probe_offset((p.real, p.real_partition), p.fetch_offset,
                                                                     READ_UNCOMMITTED))
    assert not read.probe and read.fetch_offset == 0 and len(read.parts) == 2


def test_recent_reads_cover_their_stretches_and_stay_bounded():
    recent = RecentReads(per_partition=2, max_partitions=2)
    level = READ_UNCOMMITTED
    assert recent.probe_offset(("t", 0), 0, level) is None
    recent.add(("t", 0), 0, 100, 500, level)
    recent.add(("t", 0), 100, 200, 600, level)
    assert recent.probe_offset(("t", 0), 99, level) == 600  # the newest high watermark
    assert recent.probe_offset(("t", 0), 200, level) is None  # not read yet
    recent.add(("t", 0), 200, 300, 700, level)  # the oldest stretch goes
    assert recent.probe_offset(("t", 0), 50, level) is None and recent.probe_offset(("t", 0), 250, level) == 700
    recent.add(("t", 0), 300, None, 800, level)  # a read with no complete batch covers nothing
    assert recent.probe_offset(("t", 0), 300, level) is None and recent.probe_offset(("t", 0), 250, level) == 800
    recent.add(("u", 0), 0, 10, 10, level)
    recent.add(("v", 0), 0, 10, 10, level)  # a third partition: the least recently read one goes
    assert recent.probe_offset(("t", 0), 250, level) is None and recent.probe_offset(("v", 0), 5, level) == 10


def test_a_recent_read_is_probed_for_only_at_its_isolation_level():
    """Its cached shares serve only consumers of that level: for the other, a probe would
    find nothing and cost a round trip."""
    recent = RecentReads()
    recent.add(("t", 0), 0, 100, 120, READ_UNCOMMITTED)
    assert recent.probe_offset(("t", 0), 50, READ_UNCOMMITTED) == 120
    assert recent.probe_offset(("t", 0), 50, READ_COMMITTED) is None
    recent.add(("t", 0), 0, 80, 120, READ_COMMITTED)
    assert recent.probe_offset(("t", 0), 50, READ_COMMITTED) == 120


def test_a_forgotten_partition_is_not_probed():
    recent = RecentReads()
    recent.add(("t", 0), 0, 100, 120, READ_UNCOMMITTED)
    recent.forget(("t", 0))
    assert recent.probe_offset(("t", 0), 50, READ_UNCOMMITTED) is None
    assert not recent.at_log_end(("t", 0), 500)


def test_every_share_of_the_virtual_topics_read():
    parts = [_part(1, 0), _part(2, 0)]
    assert every_share(parts) == [(share,) for share in share_ranges(4)]
    real = FetchPart(topic="t", index=0, real="t", real_id=None, real_partition=0, share=None, fetch_offset=0,
                     max_bytes=1)
    assert every_share([real]) == []


def test_a_position_at_the_last_high_watermark_is_at_the_log_end():
    recent = RecentReads()
    assert not recent.at_log_end(("t", 0), 0)  # nothing read yet: the first read is worth waiting for
    recent.add(("t", 0), 0, 100, 120, READ_UNCOMMITTED)
    assert not recent.at_log_end(("t", 0), 100) and recent.at_log_end(("t", 0), 120)


# -- OFFSET_OUT_OF_RANGE: the error belongs to the parts whose own position is out of range ----


def _read_of(parts, out_of_range):
    (read,) = plan_reads(parts, set(), floor_of=out_of_range.floor)
    return read


def test_an_unplaced_refusal_goes_to_the_refused_position_and_the_next_read_starts_above_it():
    """Kafka answers OFFSET_OUT_OF_RANGE with -1 for the log start: only the parts at the
    read's position are known to be out of range."""
    out_of_range = OutOfRange()
    parts = [_part(0, 50), _part(1, 200), _part(2, 50)]
    read = _read_of(parts, out_of_range)
    assert read.fetch_offset == 50 and not read.below_floor
    assert [p.index for p in out_of_range.refused(read, -1)] == [0, 2]
    read = _read_of(parts, out_of_range)
    assert read.fetch_offset == 200 and [p.index for p in read.parts] == [1]
    assert [p.index for p in read.below_floor] == [0, 2]


def test_a_placed_refusal_goes_to_every_part_below_the_log_start():
    out_of_range = OutOfRange()
    parts = [_part(0, 50), _part(1, 200), _part(2, 80)]
    read = _read_of(parts, out_of_range)
    assert [p.index for p in out_of_range.refused(read, 100)] == [0, 2]
    assert out_of_range.floor(("t", 0)) == 100
    assert _read_of(parts, out_of_range).fetch_offset == 200


def test_a_successful_read_refuses_the_parts_below_its_log_start_and_forgets_the_rest():
    """The log start is 100; parts 0 and 2 (at 50 and 80) are below it, part 1 is not."""
    out_of_range = OutOfRange()
    parts = [_part(0, 50), _part(1, 200), _part(2, 80)]
    out_of_range.refused(_read_of(parts, out_of_range), -1)  # at 50
    read = _read_of(parts, out_of_range)
    assert read.fetch_offset == 80
    assert [p.index for p in out_of_range.refused(read, -1)] == [2]  # part 0 is not known to be out
    read = _read_of(parts, out_of_range)
    assert read.fetch_offset == 200
    assert [p.index for p in out_of_range.served(read, 100)] == [0, 2]
    assert out_of_range.floor(("t", 0)) == 100  # parts 0 and 2 still wait below it
    read = _read_of([_part(0, 50), _part(1, 250), _part(2, 100)], out_of_range)  # part 2 reset
    assert read.fetch_offset == 100 and [p.index for p in read.below_floor] == [0]
    assert [p.index for p in out_of_range.served(read, 100)] == [0]
    read = _read_of([_part(0, 100), _part(1, 250), _part(2, 150)], out_of_range)  # part 0 reset
    assert read.fetch_offset == 100 and not read.below_floor
    assert out_of_range.served(read, 100) == [] and out_of_range.floor(("t", 0)) is None


def test_parts_all_below_the_floor_are_read_from_the_lowest_again():
    """The broker decides again: a floor never keeps a position from being read."""
    out_of_range = OutOfRange()
    out_of_range.refused(_read_of([_part(0, 50), _part(1, 200)], out_of_range), -1)
    read = _read_of([_part(0, 50)], out_of_range)
    assert read.fetch_offset == 50 and [p.index for p in read.parts] == [0] and not read.below_floor
