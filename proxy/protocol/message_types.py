"""The classes of decoded messages by message name: ``FetchRequest``, ``FetchResponse``,
``RequestHeader``, ``IndividualCommitKey``..., their structs nested in them by Kafka
struct name (``FetchRequest.FetchTopic``).

They are the classes ``values.py`` makes from the definitions (schema view ``ours``), the
ones every decode returns and every encode takes, made on first use of a name here.
``message_types.pyi``, generated from the same definitions (``python -m
proxy.protocol.stubs``), describes them to the type checker: annotate a decoded value with
its class and mypy checks every field it reads or sets::

    from proxy.protocol.message_types import FetchRequest

    def partitions(body: FetchRequest) -> int:
        return sum(len(topic.partitions) for topic in body.topics)

    body = FetchRequest(max_wait_ms=500, topics=[FetchRequest.FetchTopic(topic="t")])
"""

from __future__ import annotations

from proxy.protocol.values import message_classes


def __getattr__(name: str) -> type:
    if name.startswith("__"):
        raise AttributeError(name)
    try:
        cls = message_classes("ours", name).root
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no message class {name!r}") from None
    globals()[name] = cls
    return cls
