"""Workload 3, key-range delivery (no work): N = 1, 4, 16 range consumers share one
partition through the proxy, against one consumer of the same kind reading the whole
partition straight from the broker, in the same round:

- ``trio Consumer``: ``proxy.client.Consumer`` tasks of one process (assign mode, equal
  shares), against one such Consumer direct;
- ``raw client``: the minimal wire client (``harness.raw_client``), one thread and
  connection each, counting records from batch headers, against itself direct;
- ``share group``: ShareConsumerPerformance with N share consumers, against Kafka's
  ConsumerPerformance direct (both Java; no key ranges, the share group splits by record);
- ``floor``: one raw client reading the whole partition through a bare relay
  (``benchmarks/bare_relay.py``) and through a relay that also splits every record set
  it relays into N key ranges (``benchmarks/hashing_relay.py``: the least any key-range
  proxy must do), against the raw client direct; and the proxy's raw-client rows against
  that relay, round by round.

- ``instances`` (``python -m benchmarks keyrange_instances``, its own results): N raw
  clients of equal key ranges spread over R proxy instances (client i through instance
  i mod R, as a load balancer in front of proxy replicas spreads them), R from
  ``--instances`` (default 1, 2, 3), N = every ``--workers`` count above 1, against one raw
  client direct. Each instance reads a batch once for the ranges it serves, so the broker
  is read up to R times: the amplification summed over the instances is the figure.

Every range run gets fresh proxies (cold records cache, ``reserve.message.value.range.fetch``
on: the default), so its broker read amplification (record bytes the proxies read from the
broker for the partition / the partition's size) is that run's alone.
"""

from __future__ import annotations

import argparse
import re
import threading
import time
import urllib.request
import uuid

import trio

from benchmarks.benchmark import Benchmark, Progress
from benchmarks.peers import bare_relay, share_groups
from benchmarks.rounds import Row, goal, rotation
from benchmarks.workloads import data
from benchmarks.workloads.passthrough import consume as java_consume
from harness import java_tools
from harness.kafka_cluster import KafkaCluster
from harness.raw_client import RawClient
from harness.raw_client import partition_bytes as raw_partition_bytes
from proxy.local_kafka import ProxyProcess, free_port, scratch_dir
from proxy.ranges import equal_shares
from proxy.records.batch import RecordBatch, iter_batches

TOPIC = "krd-delivery"
KINDS = ("trio Consumer", "raw client", "floor", "share group")  # of keyrange_delivery; "instances" on its own
FLOOR_GOALS = {4: 0.95, 16: 0.80}  # N -> the least share of the floor's records/s raw range clients reach


def raw_clients(bootstrap: str | list[str], n: int | None, end: int, *, max_bytes: int = 1 << 20) -> tuple[float, int]:
    """``n`` raw clients (None: one, without ranges) reading offsets [0, end); (seconds, records).
    Given several bootstrap addresses (proxy instances), client i goes through the (i mod R)-th."""
    addresses = [bootstrap] if isinstance(bootstrap, str) else bootstrap
    shares = [None] if n is None else [[share] for share in equal_shares(n)]
    counts = [0] * len(shares)
    errors: list[BaseException] = []

    def read(slot: int, ranges) -> None:
        try:
            with RawClient.to_leader(addresses[slot % len(addresses)], TOPIC, client_id=f"bench-{slot}") as client:
                topic_id = client.topic_id(TOPIC)
                position = delivered = 0
                while position < end:
                    entry = client.range_fetch(topic_id, 0, position, ranges, max_bytes=max_bytes, max_wait_ms=100)
                    if entry.error_code:
                        raise RuntimeError(f"fetch error {entry.error_code}")
                    for batch in iter_batches(entry.records or b""):
                        if isinstance(batch, RecordBatch):
                            if batch.header.base_offset + batch.header.last_offset_delta >= position:
                                delivered += batch.header.record_count
                            position = max(position, batch.header.next_offset)
                counts[slot] = delivered
        except BaseException as exc:  # reported by the caller
            errors.append(exc)

    seconds = timed_threads([(read, (i, ranges)) for i, ranges in enumerate(shares)])
    if errors:
        raise errors[0]
    return seconds, sum(counts)


def timed_threads(calls) -> float:
    """Runs each ``(function, args)`` of ``calls`` on a thread of its own, all at once;
    the seconds from the first start to the last end."""
    threads = [threading.Thread(target=function, args=args) for function, args in calls]
    began = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - began


def trio_consumers(bootstrap: str, n: int | None, end: int, *, timeout: float = 600) -> tuple[float, int]:
    """``n`` trio Consumers (None: one, without ranges) reading offsets [0, end)."""
    return trio.run(_trio_consumers, bootstrap, n, end, timeout)


async def _trio_consumers(bootstrap: str, n: int | None, end: int, timeout: float) -> tuple[float, int]:
    from proxy.client import Consumer, TopicPartition

    tp = TopicPartition(TOPIC, 0)
    shares = [[]] if n is None else [[share] for share in equal_shares(n)]
    counts = [0] * len(shares)

    async def read(slot: int) -> None:
        async with Consumer(bootstrap, client_id=f"bench-{slot}", auto_offset_reset="earliest") as consumer:
            consumer.assign({tp: shares[slot]})
            while (consumer.position(tp) or 0) < end:
                counts[slot] += len(await consumer.poll(0.5))

    began = time.perf_counter()
    with trio.fail_after(timeout):
        async with trio.open_nursery() as nursery:
            for slot in range(len(shares)):
                nursery.start_soon(read, slot)
    return time.perf_counter() - began, sum(counts)


def _broker_bytes(proxy: ProxyProcess) -> float:
    text = urllib.request.urlopen(proxy.metrics_url, timeout=10).read().decode()
    pattern = rf'^kafka_proxy_keyrange_broker_bytes_total\{{[^}}]*topic="{TOPIC}"[^}}]*\}} ([0-9.e+]+)$'
    return sum(float(m.group(1)) for m in re.finditer(pattern, text, re.M))


def run(report: dict, progress, *, mb: int, value_size: int, consumers: list[int], rounds: int,
        share_records: int, kinds: list[str] | None = None, instances: list[int] | None = None) -> None:
    kinds = list(kinds or KINDS)
    instances = sorted(set(instances or [1, 2, 3]))
    spread = [n for n in consumers if n > 1]
    if not spread or instances == [1]:
        kinds = [kind for kind in kinds if kind != "instances"]
    records = mb * 2**20 // (value_size + 30)
    share_records = min(share_records, records)
    report["sizes"] = {"partition MB": mb, "records": records, "value bytes": value_size, "keys": 10007,
                       "consumers": consumers, "rounds": rounds}
    if "share group" in kinds:
        report["sizes"]["share group rows and their baseline read the first"] = f"{share_records:,} records"
    if "instances" in kinds:
        report["sizes"]["proxy instances"] = instances
    workdir = scratch_dir("bench-keyrange-delivery-")
    progress.step("starting Kafka")
    values: dict[tuple[str, str], list[float]] = {}
    amplification: dict[int, list[float]] = {n: [] for n in consumers}
    spread_amplification: dict[tuple[int, int], list[float]] = {(n, r): [] for n in spread for r in instances}
    relay_port = free_port()
    with KafkaCluster.start(1, workdir=workdir / "kafka", broker_properties=share_groups.BROKER_PROPERTIES,
                            **bare_relay.cluster_options(relay_port)) as cluster:
        progress.step(f"writing {records:,} records ({mb} MB)")
        java_tools.create_topic(cluster.bootstrap_servers, TOPIC, partitions=1)
        data.produce_keyed(cluster.bootstrap_servers, TOPIC, records, keys=10007, value_size=value_size)
        partition_bytes = raw_partition_bytes(cluster.bootstrap_servers, TOPIC, records)
        report["sizes"]["partition MB"] = round(partition_bytes / 2**20, 1)
        overrides = {"metrics.port": "0"}  # the defaults otherwise (metrics: the broker bytes read)

        def through_proxy(kind: str, n: int) -> float:
            proxy = ProxyProcess.start(cluster.bootstrap_servers, overrides=overrides,
                                       workdir=workdir / f"proxy-{uuid.uuid4().hex[:6]}")
            try:
                if kind == "raw client":
                    seconds, delivered = raw_clients(proxy.bootstrap_servers, n, records)
                else:
                    seconds, delivered = trio_consumers(proxy.bootstrap_servers, n, records)
                amplification[n].append(_broker_bytes(proxy) / partition_bytes)
            finally:
                proxy.stop()
            if delivered != records:
                raise RuntimeError(f"{kind} N={n} delivered {delivered} of {records} records")
            return delivered / seconds

        def across(n: int, r: int) -> float:
            """N raw clients over R fresh proxies; the amplification summed over them."""
            proxies: list[ProxyProcess] = []
            try:
                for _ in range(r):
                    proxies.append(ProxyProcess.start(cluster.bootstrap_servers, overrides=overrides,
                                                      workdir=workdir / f"proxy-{uuid.uuid4().hex[:6]}"))
                seconds, delivered = raw_clients([proxy.bootstrap_servers for proxy in proxies], n, records)
                spread_amplification[(n, r)].append(sum(map(_broker_bytes, proxies)) / partition_bytes)
            finally:
                for proxy in proxies:
                    proxy.stop()
            if delivered != records:
                raise RuntimeError(f"N={n} over {r} instances delivered {delivered} of {records} records")
            return delivered / seconds

        def direct(kind: str) -> float:
            if kind in ("raw client", "instances"):
                seconds, delivered = raw_clients(cluster.bootstrap_servers, None, records)
            elif kind == "trio Consumer":
                seconds, delivered = trio_consumers(cluster.bootstrap_servers, None, records)
            else:
                # the share group's pair reads a prefix: share consumers are too slow for the whole
                return java_consume(cluster.bootstrap_servers, TOPIC, share_records)["records_per_s"]
            return delivered / seconds

        def floor(contender: str) -> float:
            """One raw client, the whole partition, through the bare relay or the splitting one."""
            module, extra = (("benchmarks.bare_relay", ()) if contender == "bare"
                             else ("benchmarks.hashing_relay", (contender,)))
            with bare_relay.running(relay_port, bare_relay.target(cluster), module=module, args=extra):
                seconds, delivered = raw_clients(f"127.0.0.1:{relay_port}", None, records)
            if delivered != records:
                raise RuntimeError(f"floor {contender} delivered {delivered} of {records} records")
            return delivered / seconds

        def share(n: int) -> float:
            result = share_groups.consumer_performance(cluster.bootstrap_servers, TOPIC, f"krd-{uuid.uuid4().hex[:6]}",
                                                       share_records, threads=n)
            return result["records_per_s"]

        progress.step("warm-up: one direct read")
        direct("raw client")
        for number in range(rounds):
            for kind in kinds:
                contenders = ["direct", *(["bare"] if kind == "floor" else []),
                              *([f"{n}x{r}" for n in spread for r in instances] if kind == "instances"
                                else map(str, consumers))]
                for contender in rotation(contenders, number):
                    progress.step(f"round {number + 1}/{rounds}: {kind}, "
                                  f"{contender if contender in ('direct', 'bare') else 'N=' + contender}")
                    if kind == "instances" and contender != "direct":
                        n, _, r = contender.partition("x")
                        rate = across(int(n), int(r))
                    elif contender == "direct":
                        rate = direct("raw client" if kind == "floor" else kind)
                    elif kind == "floor":
                        rate = floor(contender)
                    elif kind == "share group":
                        rate = share(int(contender))
                    else:
                        rate = through_proxy(kind, int(contender))
                    values.setdefault((kind, contender), []).append(rate)

    rows = []
    for kind in kinds:
        if kind == "floor":  # one raw client reading the whole partition through each relay
            group, baseline = "floor", "raw client direct"
            rows.append(Row(group, "bare relay", "records/s", values[(kind, "bare")], baseline,
                            values[(kind, "direct")]))
            for n in consumers:
                rows.append(Row(group, f"relay splitting into N={n}", "records/s",
                                values[(kind, str(n))], baseline, values[(kind, "direct")]))
            if "raw client" in kinds:
                for n in consumers:
                    rows.append(Row("proxy against the floor", f"raw client N={n}", "records/s",
                                    values[("raw client", str(n))], f"relay splitting into N={n}",
                                    values[(kind, str(n))]))
            continue
        if kind == "instances":  # N raw clients over R proxy instances
            for n in spread:
                for r in instances:
                    rows.append(Row("raw clients over R proxy instances", f"N={n}, {r} instance{'s' * (r > 1)}",
                                    "records/s", values[(kind, f"{n}x{r}")], "raw client direct",
                                    values[(kind, "direct")]))
                for r in instances[1:]:
                    rows.append(Row("raw clients over R proxy instances", f"N={n}, {r} instances", "records/s",
                                    values[(kind, f"{n}x{r}")], f"N={n}, {instances[0]} instance",
                                    values[(kind, f"{n}x{instances[0]}")]))
            continue
        baseline = "Java ConsumerPerformance direct" if kind == "share group" else f"{kind} direct"
        for n in consumers:
            rows.append(Row(kind, f"N={n}" + (" share consumers" if kind == "share group" else " range consumers"),
                            "records/s", values[(kind, str(n))], baseline, values[(kind, "direct")]))
    for n in consumers:
        if amplification[n]:
            ones = [1.0] * len(amplification[n])
            rows.append(Row("broker read amplification (lower is better)", f"N={n}", "x", amplification[n],
                            "partition size", ones, higher_is_better=False))
    for (n, r), measured in spread_amplification.items():
        if measured:
            rows.append(Row("broker read amplification over R instances (lower is better)",
                            f"N={n}, {r} instance{'s' * (r > 1)}", "x", measured, "partition size",
                            [1.0] * len(measured), higher_is_better=False))
    report["rows"] = [row.as_dict() for row in rows]
    by = {(r.group, r.name): r for r in rows}
    goals = []
    for kind in kinds:
        if kind in ("trio Consumer", "raw client") and 4 in consumers:
            goals.append(goal(f"{kind}: N=4 aggregate >= 0.5 x direct", by[(kind, "N=4 range consumers")].ratio, 0.5))
    for n, least in FLOOR_GOALS.items():  # what a relay that only splits reaches is the ceiling
        row = by.get(("proxy against the floor", f"raw client N={n}"))
        if row is not None:
            goals.append(goal(f"raw client N={n} >= {least} x a relay splitting into N (the floor)", row.ratio, least))
    for n in (4, 16):
        if n in consumers and amplification[n]:
            goals.append(goal(f"broker read amplification at N={n} <= 1.1",
                              by[("broker read amplification (lower is better)", f"N={n}")].value, 1.1,
                              at_least=False))
    for (n, r), measured in spread_amplification.items():  # each instance reads the partition once
        if measured:
            goals.append(goal(f"broker read amplification, N={n} over {r} instance{'s' * (r > 1)} <= 1.1 x {r}",
                              by[("broker read amplification over R instances (lower is better)",
                                  f"N={n}, {r} instance{'s' * (r > 1)}")].value, 1.1 * r, at_least=False))
    report["goals"] = goals
    report["partition_bytes"] = partition_bytes


def _from_args(report: dict, progress: Progress, args: argparse.Namespace) -> None:
    run(report, progress, mb=args.delivery_mb, value_size=100, consumers=args.workers, rounds=args.rounds,
        share_records=args.share_records)


BENCHMARK = Benchmark(
    "keyrange_delivery", "Key-range delivery: N range consumers on one partition against one direct reader",
    method="No work per record. Same-kind pairs: N trio Consumers through the proxy against one trio Consumer "
           "direct; N raw header-counting clients against one direct; N share consumers "
           "(ShareConsumerPerformance) against Kafka's ConsumerPerformance. A fresh proxy per range run.",
    steps=lambda args: 3 + args.rounds * (4 + 4 * len(args.workers)), run=_from_args, default=True)
