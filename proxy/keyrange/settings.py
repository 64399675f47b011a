"""Key-range fetch settings (docs/proxy.md#key-range-fetch)."""

from __future__ import annotations

from dataclasses import dataclass

from proxy.settings import PerTopic, Settings, at_least, choice, flag, integer, per_topic


@dataclass(frozen=True)
class KeyRangeTopicSettings(Settings):
    """Per topic: ``topic.<topic name>.<setting>``, or ``<setting>`` for every topic."""

    fetch_enabled: bool = flag("key.range.fetch.enabled", True, "Serve key-range fetches of the topic.",
                               aliases=("accept.range.fetch",), reloadable=True)
    # The proposal's default is false: a broker that reads a partition again reads its own
    # page cache. A proxy reads it again across the network, once per range set.
    cache_records: bool = flag(
        "reserve.message.value.range.fetch", True,
        "Cache filtered records themselves (true) or only the matching offsets (false); key-range prefetch needs "
        "true. The proposal's default is false, the proxy's true (docs/proxy.md#key-range-fetch).",
        reloadable=True,
        cost="true: each broker read's shares for the other range sets are held until served, within "
             "max.bytes.key.range.results. false: every range set reads the broker itself, broker read "
             "amplification N (measured 4.0 at N=4 range sets, 16.0 at N=16, against 1.01 and 1.09 with true), and "
             "its consumers get 0.38 (N=4) and 0.25 (N=16) of the records/s (benchmarks/results/keyrange.json).")


@dataclass(frozen=True)
class KeyRangeSettings(Settings):
    cache_bytes: int = integer(
        "max.bytes.key.range.results", 209715200,
        "Cap on the memory the key-range result cache of each worker holds. Each share is charged what it takes: its buffer "
        "(records, or 41 bytes an offset) plus about 1.3 KB of objects and cache entries (measured), so a full cache "
        "holds about this many bytes.", at_least(0), reloadable=True,
        cost="memory, up to about this much. What it needs is how far a partition's slowest range consumer trails "
             "the others, times its share; a cap below that evicts the shares it needs next, and it reads them from "
             "the broker again (measured at N=4, one consumer 20 ms slower a fetch: the cache peaked at 53 MB, a "
             "64 MiB cap held it, 16 MiB doubled broker reads; benchmarks/results/keyrange_slow.json).")
    compression: str = choice("key.range.fetch.compression", "source", ("source", "none"),
                              "Filtered batches keep their codec (source) or go out uncompressed (none).")
    interest_ms: int = integer("key.range.interest.ms", 30000,
                               "A range set not requested for this long is no longer split out of broker reads.",
                               at_least(100))
    prefetch_enabled: bool = flag(
        "key.range.prefetch.enabled", True,
        "Key-range prefetch: read the next position of a partition two or more range sets share from the broker as "
        "soon as a consumer reaches it, and cache every set's share before they ask (topics with "
        "reserve.message.value.range.fetch=true).", aliases=("key.range.readahead.enabled",),
        cost="one broker read per shared partition ahead of its foremost consumer, its shares held in the cache "
             "(within max.bytes.key.range.results); false: every consumer waits for each read and its split.")
    prefetch_max_bytes: int = integer(
        "key.range.prefetch.max.bytes", 16777216,
        "Largest broker read of one partition that key-range prefetch makes. A read ahead asks for the consumer's "
        "partition limit once per range set sharing the partition (7/8 of it: each share about fills one answer), "
        "up to this, and to half what the result cache has left.", at_least(0), reloadable=True,
        cost="up to this much per shared partition held in the result cache until its consumers take their shares "
             "(within max.bytes.key.range.results). Lower: answers of a 1/N part of the consumer's limit, one Fetch "
             "each (measured with 16 range consumers of 1 MiB limits against the build that read one limit ahead: "
             "1.97 x the records/s at 0.45 x the proxy CPU per record; benchmarks/results/wide-read-ahead).")
    native_answers: bool = flag(
        "key.range.native.answers.enabled", False,
        "The native relay answers a sessionless key-range Fetch (v13-v17, topics by id) whose every partition's "
        "share is cached and needs no read-ahead, without the event loop (docs/proxy.md#native-answers). Off by "
        "default: with read-ahead one read ahead, range consumers mostly wait for the read on its way, and the "
        "relay answered 8-9 % of their Fetches at a cost in proxy CPU (measured).",
        cost="each cached share is charged about 0.7 KB more within max.bytes.key.range.results; runs of the "
             "native relay on range consumers' connections: measured 1.07-1.10 x the proxy CPU per record at N=4 "
             "and 16 range consumers, records/s within the runs' spread (benchmarks/results/native-answers).")
    split_threads: int = integer("key.range.split.threads", 0,
                                 "Worker threads that split large broker reads by key range off the event loop (needs "
                                 "the C kernels; 0: on the event loop, measured faster on 2 cores, docs/proxy.md).",
                                 at_least(0),
                                 cost="a thread each; a trip to one and back about 0.04 us of CPU a record (4 "
                                      "consumers: 6.7 M records/s on the event loop, 5.3 M with one thread, 2 cores).")
    split_thread_min_bytes: int = integer(
        "key.range.split.thread.min.bytes", 65536,
        "Broker reads smaller than this are split on the event loop (a trip to a thread costs more).", at_least(0))
    topics: PerTopic[KeyRangeTopicSettings] = per_topic(KeyRangeTopicSettings)
