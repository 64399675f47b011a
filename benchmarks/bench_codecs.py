"""Message codec speed: decode and encode time per message, one core.

Workloads, each at the newest version our schemas know:

* ``metadata_response``: Metadata response, 3 brokers, 10 topics x 100 partitions
  (1000 partitions, 3 replicas each);
* ``fetch_request``: Fetch request, 10 topics x 10 partitions (100 partitions), half of
  them with a tag-10000 ``KeyRanges`` list (``compiled_without_extensions``: the same
  request without them, the bytes kafka-python is timed on);
* ``offset_commit_request``: OffsetCommit request, 10 topics x 10 partitions.

Each is timed through: ``frame`` (a whole frame, header and body, through
``messages.decode_request``/``encode_request`` or their response twins), ``compiled`` (what the proxy uses: construct ``compile()`` with
our ``_emitparse``/``_emitbuild``), ``interpreted`` (the same construct tree walked by its
``read``/``write`` methods) and, for reference, kafka-python's own codec on the same bytes
(standard view, no tag 10000). The Metadata response is also timed with a definition
written in construct's stock classes (``stock_construct``, plain and ``.compile()``d):
the naive construct path this codec replaces.
Timings are the best of several repeats, in microseconds per message.

Writes ``benchmarks/results/codecs.json``; with ``--profile`` also writes a pyinstrument
profile of the compiled Metadata decode to ``benchmarks/results/codecs_profile.txt``.

Run: ``.venv/bin/python benchmarks/bench_codecs.py [--seconds S] [--profile]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.benchmark import Benchmark  # noqa: E402
from proxy.protocol import messages  # noqa: E402
from proxy.protocol.api_keys import ApiKey  # noqa: E402
from proxy.protocol.compiler import compile_message  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


def metadata_response(version: int):
    R = messages.body_class(ApiKey.METADATA, "response")
    brokers = [
        R.MetadataResponseBroker(node_id=n, host=f"broker-{n}.example.internal", port=9092, rack=f"r{n}")
        for n in (1, 2, 3)
    ]
    topics = []
    for t in range(10):
        partitions = [
            R.MetadataResponsePartition(
                partition_index=p,
                leader_id=1 + p % 3,
                leader_epoch=7,
                replica_nodes=[1, 2, 3],
                isr_nodes=[1, 2, 3],
                offline_replicas=[],
            )
            for p in range(100)
        ]
        topics.append(
            R.MetadataResponseTopic(
                name=f"topic-{t}", topic_id=uuid.UUID(int=t + 1), partitions=partitions
            )
        )
    return messages.new_body(
        ApiKey.METADATA, version, "response", brokers=brokers, cluster_id="cluster", topics=topics
    )


def fetch_request(version: int):
    F = messages.body_class(ApiKey.FETCH, "request")
    topics = []
    for t in range(10):
        partitions = []
        for p in range(10):
            ranges = [F.KeyRange(start=0, end=2**62 - 1)] if p % 2 else None
            partitions.append(
                F.FetchPartition(
                    partition=p,
                    current_leader_epoch=5,
                    fetch_offset=1_000_000 + p,
                    last_fetched_epoch=5,
                    partition_max_bytes=1 << 20,
                    key_ranges=ranges,
                )
            )
        # v13+ names topics by id only; a name set there would not survive a round trip
        name = f"topic-{t}" if version <= 12 else ""
        topics.append(F.FetchTopic(topic=name, topic_id=uuid.UUID(int=t + 1), partitions=partitions))
    return messages.new_body(
        ApiKey.FETCH, version, "request", max_wait_ms=500, min_bytes=1, max_bytes=50 << 20,
        session_id=0, session_epoch=-1, topics=topics,
    )


def offset_commit_request(version: int):
    oc = messages.body_class(ApiKey.OFFSET_COMMIT, "request")
    topics = [
        oc.OffsetCommitRequestTopic(
            name=f"topic-{t}" if version <= 9 else "",  # v10+ names topics by id
            topic_id=uuid.UUID(int=t + 1),
            partitions=[
                oc.OffsetCommitRequestPartition(
                    partition_index=p, committed_offset=123_456 + p, committed_leader_epoch=5,
                    committed_metadata="",
                )
                for p in range(10)
            ],
        )
        for t in range(10)
    ]
    return messages.new_body(
        ApiKey.OFFSET_COMMIT, version, "request", group_id="group", generation_id_or_member_epoch=3,
        member_id="member-1", topics=topics,
    )


WORKLOADS = {
    "metadata_response": (ApiKey.METADATA, "response", metadata_response, "MetadataResponse"),
    "fetch_request": (ApiKey.FETCH, "request", fetch_request, "FetchRequest"),
    "offset_commit_request": (ApiKey.OFFSET_COMMIT, "request", offset_commit_request, "OffsetCommitRequest"),
}


def stock_construct_metadata_v13():
    """Metadata response v13 written with construct's own classes only (Struct,
    PrefixedArray, PascalString, VarInt): the naive construct baseline, no tag handling
    beyond skipping, no bounds checks beyond construct's."""
    from construct import (
        Bytes,
        ExprAdapter,
        Flag,
        GreedyBytes,
        Int16sb,
        Int32sb,
        PascalString,
        Prefixed,
        PrefixedArray,
        Struct,
        VarInt,
    )

    compact_len = ExprAdapter(VarInt, lambda obj, ctx: obj - 1, lambda obj, ctx: obj + 1)

    def compact_array(sub):
        return PrefixedArray(compact_len, sub)

    compact_string = PascalString(compact_len, "utf8")
    tags = PrefixedArray(VarInt, Struct("tag" / VarInt, "data" / Prefixed(VarInt, GreedyBytes)))
    broker = Struct(
        "node_id" / Int32sb, "host" / compact_string, "port" / Int32sb,
        "rack" / compact_string, "_tags" / tags,
    )
    partition = Struct(
        "error_code" / Int16sb, "partition_index" / Int32sb, "leader_id" / Int32sb,
        "leader_epoch" / Int32sb, "replica_nodes" / compact_array(Int32sb),
        "isr_nodes" / compact_array(Int32sb), "offline_replicas" / compact_array(Int32sb),
        "_tags" / tags,
    )
    topic = Struct(
        "error_code" / Int16sb, "name" / compact_string, "topic_id" / Bytes(16),
        "is_internal" / Flag, "partitions" / compact_array(partition),
        "topic_authorized_operations" / Int32sb, "_tags" / tags,
    )
    return Struct(
        "throttle_time_ms" / Int32sb, "brokers" / compact_array(broker),
        "cluster_id" / compact_string, "controller_id" / Int32sb,
        "topics" / compact_array(topic), "error_code" / Int16sb, "_tags" / tags,
    )


def best_time_us(fn, seconds: float) -> float:
    """Best per-call time over repeats of a loop calibrated to ~seconds/10 each."""
    fn()
    loops = 1
    while True:
        started = time.perf_counter()
        for _ in range(loops):
            fn()
        elapsed = time.perf_counter() - started
        if elapsed > seconds / 20:
            break
        loops *= 2
    best = elapsed / loops
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        started = time.perf_counter()
        for _ in range(loops):
            fn()
        best = min(best, (time.perf_counter() - started) / loops)
    return best * 1e6


def kafka_python_codec(name: str):
    """kafka-python's class for ``name``, or None."""
    import importlib

    for module in ("kafka.protocol.metadata", "kafka.protocol.consumer"):
        cls = getattr(importlib.import_module(module), name, None)
        if cls is not None:
            return cls
    return None


def frame_codecs(api_key: int, kind: str, version: int, body):
    """Decode and encode of a whole frame (header and body) through ``messages``: what
    the proxy calls per request or response, on top of the body codec."""
    if kind == "request":
        header = messages.new_request_header(api_key, version, 7, "bench")
        frame = messages.encode_request(header, body)
        assert messages.decode_request(frame) == (header, body)
        return (lambda: messages.decode_request(frame)), (lambda: messages.encode_request(header, body))
    header = messages.new_response_header(7)
    frame = messages.encode_response(api_key, version, header, body)
    assert messages.decode_response(api_key, version, frame) == (header, body)
    return (
        lambda: messages.decode_response(api_key, version, frame),
        lambda: messages.encode_response(api_key, version, header, body),
    )


def run(seconds: float) -> dict:
    results = {}
    for label, (api_key, kind, build, name) in WORKLOADS.items():
        version = messages.supported_versions(api_key)[1]
        body = build(version)
        compiled = compile_message("ours", name, version)
        interpreted = compile_message("ours", name, version, "interpreted")
        data = compiled.encode(body)
        assert compiled.decode(data) == body and interpreted.encode(body) == data
        entry = {
            "version": version,
            "body_bytes": len(data),
            "decode_us": {
                "compiled": best_time_us(lambda: compiled.decode(data), seconds),
                "interpreted": best_time_us(lambda: interpreted.decode(data), seconds),
            },
            "encode_us": {
                "compiled": best_time_us(lambda: compiled.encode(body), seconds),
                "interpreted": best_time_us(lambda: interpreted.encode(body), seconds),
            },
        }
        if label == "metadata_response" and version == 13:
            stock = stock_construct_metadata_v13()
            stock_compiled = stock.compile()
            parsed = stock.parse(data)
            assert stock.build(parsed) == data and stock_compiled.parse(data) == parsed
            entry["decode_us"]["stock_construct"] = best_time_us(lambda: stock.parse(data), seconds)
            entry["decode_us"]["stock_construct_compiled"] = best_time_us(
                lambda: stock_compiled.parse(data), seconds
            )
            entry["encode_us"]["stock_construct"] = best_time_us(lambda: stock.build(parsed), seconds)
            entry["encode_us"]["stock_construct_compiled"] = best_time_us(
                lambda: stock_compiled.build(parsed), seconds
            )
        kp = kafka_python_codec(name)
        if kp is not None:
            standard = compile_message("standard", name, version)
            plain = standard.encode(standard.decode(data))  # tag-10000 fields as unknown tags
            if label == "fetch_request":  # kafka-python has no tag 10000: drop our fields
                for topic in body.topics:
                    for partition in topic.partitions:
                        partition.key_ranges = None
                plain = compiled.encode(body)
            decoded = kp.decode(plain, version=version)
            decoded._header = None
            entry["decode_us"]["kafka_python"] = best_time_us(lambda: kp.decode(plain, version=version), seconds)
            entry["encode_us"]["kafka_python"] = best_time_us(lambda: decoded.encode(version=version), seconds)
            if plain != data:  # same bytes as kafka-python gets, for a like-for-like figure
                plain_body = compiled.decode(plain)
                entry["decode_us"]["compiled_without_extensions"] = best_time_us(
                    lambda: compiled.decode(plain), seconds
                )
                entry["encode_us"]["compiled_without_extensions"] = best_time_us(
                    lambda: compiled.encode(plain_body), seconds
                )
        frame_decode, frame_encode = frame_codecs(api_key, kind, version, body)
        entry["decode_us"]["frame"] = best_time_us(frame_decode, seconds)
        entry["encode_us"]["frame"] = best_time_us(frame_encode, seconds)
        entry["speedup_compiled_vs_interpreted"] = {
            op: round(entry[f"{op}_us"]["interpreted"] / entry[f"{op}_us"]["compiled"], 2)
            for op in ("decode", "encode")
        }
        for op in ("decode_us", "encode_us"):
            entry[op] = {k: round(v, 1) for k, v in entry[op].items()}
        results[label] = entry
        print(f"{label:24} v{version} {len(data):7d} B  decode {entry['decode_us']}  encode {entry['encode_us']}")
    return results


def profile_metadata_decode(path: Path) -> None:
    from pyinstrument import Profiler

    version = messages.supported_versions(ApiKey.METADATA)[1]
    codec = compile_message("ours", "MetadataResponse", version)
    data = codec.encode(metadata_response(version))
    profiler = Profiler(interval=0.0001)
    profiler.start()
    for _ in range(300):
        codec.decode(data)
    profiler.stop()
    path.write_text(profiler.output_text(unicode=False, color=False, show_all=True))


def machine() -> dict:
    import construct
    import kafka

    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "cpu_model": cpu,
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "construct": construct.__version__ if hasattr(construct, "__version__") else "2.10.70",
        "kafka_python": kafka.__version__,
        "load_average_at_end": list(os.getloadavg()),
    }


def git_commit() -> str | None:
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.0, help="timing budget per measurement")
    parser.add_argument("--profile", action="store_true", help="also write a pyinstrument profile")
    args = parser.parse_args(argv)
    results = run(args.seconds)
    report = {
        "benchmark": "Kafka message codec, microseconds per message (one core, best of repeats)",
        "command": " ".join([os.path.relpath(sys.executable, ROOT)] + [os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:]),
        "cwd": str(ROOT),
        "git_commit": git_commit(),
        "workload": {
            "metadata_response": "3 brokers, 10 topics x 100 partitions, 3 replicas/isr each",
            "fetch_request": "10 topics x 10 partitions, every other partition with one KeyRange",
            "offset_commit_request": "10 topics x 10 partitions",
        },
        "results": results,
        "machine": machine(),
    }
    if args.profile:
        profile_path = RESULTS / "codecs_profile.txt"
        profile_metadata_decode(profile_path)
        report["profile_file"] = str(profile_path.relative_to(ROOT))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "codecs.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {RESULTS / 'codecs.json'}")


BENCHMARK = Benchmark(
    "bench_codecs", "Message codec speed, microseconds per message on one core",
    main=main, with_all=True)


if __name__ == "__main__":
    main()
