"""Individual commit settings (docs/individual-commit.md)."""

from __future__ import annotations

from dataclasses import dataclass

from proxy.settings import Settings, at_least, flag, integer


@dataclass(frozen=True)
class IndividualCommitSettings(Settings):
    enabled: bool = flag("individual.commit.enabled", True, "Accept OffsetCommit requests carrying offset ranges.",
                         aliases=("accept.individual.commit",))
    # 1000: a consumer commits what one poll processed, at most max.poll.records (500 by
    # default) records, i.e. at most 500 disjoint ranges; 1000 leaves twice that while
    # capping one partition's ranges at 16 KB and its merge at O(1000) per request.
    max_ranges: int = integer("max.individual.commit.ranges", 1000,
                              "Most offset ranges one partition of one OffsetCommit may carry.", at_least(1))
    # 10000: the state of one (group, topic, partition) holds a range per gap a lagging
    # share leaves above S; real groups hold tens to hundreds (the soak's most: 166), and
    # 10000 means one share some 20 polls of max.poll.records (500) behind the others. One
    # range costs 17 bytes in memory (the packed form), 2 to 18 in the log value (varint
    # deltas: about 2 when offsets are near each other), which every commit of the
    # partition rewrites whole: at most 170 KB in memory and 180 KB in the record, well
    # within the broker's message.max.bytes (1 MB) even with several keys in one batch.
    max_ranges_held: int = integer(
        "max.individual.commit.ranges.held", 10000,
        "Most disjoint offset ranges above the stable offset the state of one (group, topic, partition) may hold "
        "after a commit. A range commit (OffsetCommit or TxnOffsetCommit) that would leave more, and more than the "
        "state holds now, is refused for that partition with INVALID_COMMIT_OFFSET_SIZE (28) and changes nothing; "
        "commits that close gaps always pass. One range costs 17 bytes of memory and 2-18 bytes of the log record "
        "every commit rewrites: 10000 is at most 170 KB and 180 KB.", at_least(1))
