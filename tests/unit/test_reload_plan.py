"""A reload's plan: which settings take their new value, which wait for a restart, and a
mix that does not fit refused as a whole (``proxy.server.reload``)."""

import pytest

from proxy.server.config import ConfigError, build_config
from proxy.server.reload import Change, plan_reload, reloadable_keys, shown

BASE = {"bootstrap.servers": "127.0.0.1:9092", "listen.port": "9192"}


def _plan(old: dict, new: dict):
    return plan_reload(build_config({**BASE, **old}), build_config({**BASE, **new}))


def test_nothing_read_differs_nothing_changes():
    current = build_config({**BASE, "max.connections": "7"})
    plan = plan_reload(current, build_config({**BASE, "max.connections": "7"}))
    assert plan.applied == () and plan.kept == ()
    assert plan.config == current


def test_reloadable_settings_take_their_new_values():
    plan = _plan({"max.connections": "100", "log.level": "INFO"},
                 {"max.connections": "50", "log.level": "DEBUG", "queued.max.request.bytes": "2097152",
                  "max.bytes.key.range.results": "1048576"})
    assert {c.key: (c.old, c.new) for c in plan.applied} == {
        "max.connections": (100, 50),
        "log.level": ("INFO", "DEBUG"),
        "queued.max.request.bytes": (104857600, 2097152),
        "max.bytes.key.range.results": (209715200, 1048576),
    }
    assert plan.kept == ()
    assert plan.config.limits.max_connections == 50
    assert plan.config.operations.log_level == "DEBUG"
    assert plan.config.limits.queued_max_request_bytes == 2097152
    assert plan.config.keyrange.cache_bytes == 1048576


def test_restart_only_settings_keep_the_value_in_force_and_are_reported():
    plan = _plan({"node.port.base": "20000", "max.connections": "100"},
                 {"node.port.base": "30000", "listen.port": "9300", "max.connections": "5",
                  "cooperative.fetch.enabled": "false"})
    kept = {c.key: (c.old, c.new) for c in plan.kept}
    assert kept == {"listen.port": (9192, 9300), "node.port.base": (20000, 30000),
                    "cooperative.fetch.enabled": (True, False)}
    assert all(not c.reloadable for c in plan.kept)
    assert plan.config.cluster.listen_port == 9192
    assert plan.config.cluster.node_port_base == 20000
    assert plan.config.coop.enabled is True
    # ... while the reloadable one in the same file goes in force
    assert [c.key for c in plan.applied] == ["max.connections"]
    assert plan.config.limits.max_connections == 5


def test_a_restart_only_change_is_reported_again_at_the_next_reload():
    first = _plan({}, {"listen.port": "9300"})
    again = plan_reload(first.config, build_config({**BASE, "listen.port": "9300"}))
    assert [c.key for c in again.kept] == ["listen.port", "node.port.base"]
    assert again.config.cluster.listen_port == 9192


def test_a_derived_default_follows_what_it_is_derived_from():
    """node.port.base 0 means listen.port + 1: a new listen.port changes both, and both wait."""
    plan = _plan({}, {"listen.port": "9300"})
    assert {c.key: (c.old, c.new) for c in plan.kept} == {"listen.port": (9192, 9300),
                                                          "node.port.base": (9193, 9301)}


def test_per_topic_settings_are_compared_topic_by_topic():
    plan = _plan({"topic.orders.key.range.fetch.enabled": "false", "topic.audit.reserve.message.value.range.fetch": "true"},
                 {"topic.orders.key.range.fetch.enabled": "true", "topic.payments.key.range.fetch.enabled": "false",
                  "reserve.message.value.range.fetch": "false"})
    changes = {c.key: (c.old, c.new) for c in plan.applied}
    assert changes["topic.orders.key.range.fetch.enabled"] == (False, True)
    assert changes["topic.payments.key.range.fetch.enabled"] == (True, False)
    # audit no longer named: it gets the default of every topic
    assert changes["topic.audit.reserve.message.value.range.fetch"] == (True, False)
    topics = plan.config.keyrange.topics
    assert topics.of("orders").fetch_enabled is True
    assert topics.of("payments").fetch_enabled is False
    assert topics.of("audit").cache_records is False
    assert "audit" not in topics.topics
    assert plan.kept == ()


def test_a_new_default_of_every_topic_is_one_change_and_reaches_the_topics_that_inherit_it():
    plan = _plan({"topic.orders.reserve.message.value.range.fetch": "true"}, {"key.range.fetch.enabled": "false",
                                                                            "topic.orders.reserve.message.value.range.fetch": "true"})
    keys = [c.key for c in plan.applied]
    assert keys == ["key.range.fetch.enabled", "topic.orders.key.range.fetch.enabled"]
    assert plan.config.keyrange.topics.of("anything").fetch_enabled is False
    assert plan.config.keyrange.topics.of("orders").fetch_enabled is False


def test_a_new_value_that_does_not_fit_the_restart_only_ones_in_force_is_refused(tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.write_text("x")
    key.write_text("x")
    tls = {"ssl.listener.enabled": "true", "ssl.listener.certfile": str(cert), "ssl.listener.keyfile": str(key)}
    # the file turns TLS off and drops the files: TLS stays on until a restart, so the files are still needed
    with pytest.raises(ConfigError) as caught:
        _plan(tls, {})
    message = str(caught.value)
    assert message.startswith("ssl.listener.enabled: needs ssl.listener.certfile and ssl.listener.keyfile")
    assert "with ssl.listener.enabled as in force: changing it needs a restart" in message


def test_renamed_settings_are_read_under_their_new_names():
    plan = _plan({}, {"topic.orders.accept.range.fetch": "false"})
    assert [c.key for c in plan.applied] == ["topic.orders.key.range.fetch.enabled"]
    assert plan.config.renamed == (("topic.orders.accept.range.fetch", "topic.orders.key.range.fetch.enabled"),)


def test_the_reloadable_settings():
    """Each of these is put in force by ProxyServer.apply_settings or read where it is used;
    a setting added here needs the same."""
    assert set(reloadable_keys()) == {
        "upstream.connect.timeout.ms",
        "ssl.listener.certfile", "ssl.listener.keyfile", "ssl.upstream.cafile", "ssl.upstream.check.hostname",
        "max.frame.bytes", "max.frame.bytes.unauthenticated", "queued.max.request.bytes", "max.connections",
        "max.inflight.requests.per.connection", "socket.send.buffer.bytes", "connections.max.idle.ms",
        "connections.setup.timeout.ms",
        "log.level", "shutdown.drain.timeout.ms",
        "max.bytes.key.range.results", "key.range.fetch.enabled", "reserve.message.value.range.fetch",
        "key.range.prefetch.max.bytes",
    }


@pytest.mark.parametrize("value, text", [
    (True, "true"), (False, "false"), (5, "5"), ("", '""'), ("INFO", "INFO"),
    ([("h", 1), ("g", 2)], "h:1,g:2"), ({1: ("h", 9)}, "1@h:9"),
])
def test_values_are_shown_as_written_in_a_file(value, text):
    assert shown(value) == text


def test_a_change_describes_itself():
    assert Change("max.connections", 10, 5, True).describe() == "max.connections: 10 -> 5"
