"""Configuration: every mistake is refused at start with the key and the problem named."""

import pytest

from proxy.server.config import ConfigError, build_config, load_config, parse_properties


def test_defaults_follow_the_design_contract():
    config = build_config({"bootstrap.servers": "127.0.0.1:9092"})
    assert config.keyrange.cache_bytes == 209715200
    assert config.individual.enabled is True
    assert config.commit_log.segment_bytes == 10485760
    assert config.individual.max_ranges_held == 10000
    assert config.limits.max_frame_bytes == 100 * 1024 * 1024
    assert config.keyrange.topics.of("orders").fetch_enabled is True
    # the proposal's default is false; the proxy's is true (docs/wire-contract.md#5-result-cache)
    assert config.keyrange.topics.of("orders").cache_records is True
    assert config.cluster.node_port_base == config.cluster.listen_port + 1
    assert config.renamed == ()


def test_properties_file_with_comments_continuations_and_overrides(tmp_path):
    path = tmp_path / "proxy.properties"
    path.write_text(
        "# the cluster\n"
        "bootstrap.servers=127.0.0.1:9092,\\\n"
        "   127.0.0.1:9093\n"
        "! another comment\n"
        "listen.port: 19092\n"
        "topic.orders.eu.key.range.fetch.enabled=false\n"
    )
    config = load_config(str(path), ["listen.port=29092", "max.connections=5"])
    assert config.cluster.bootstrap_servers == [("127.0.0.1", 9092), ("127.0.0.1", 9093)]
    assert config.cluster.listen_port == 29092
    assert config.limits.max_connections == 5
    # topic names may contain dots: the setting is matched as a suffix
    assert config.keyrange.topics.of("orders.eu").fetch_enabled is False
    assert config.keyrange.topics.of("orders").fetch_enabled is True


@pytest.mark.parametrize(
    "entries, message",
    [
        ({}, "bootstrap.servers: required"),
        ({"bootstrap.servers": "nohostport"}, "bootstrap.servers: invalid value"),
        ({"bootstrap.servers": "h:1", "max.connections": "0"}, "max.connections: must be at least 1"),
        ({"bootstrap.servers": "h:1", "max.frame.bytes": "lots"}, "max.frame.bytes: invalid value 'lots'"),
        ({"bootstrap.servers": "h:1", "topology": "mesh"}, "topology: must be one of"),
        ({"bootstrap.servers": "h:1", "max.conections": "5"}, "max.conections: unknown setting"),
        ({"bootstrap.servers": "h:1", "topic.t.accept.rangefetch": "x"}, "unknown per-topic setting"),
        ({"bootstrap.servers": "h:1", "topic.t.key.range.fetch.enabled": "maybe"},
         "topic.t.key.range.fetch.enabled: invalid value 'maybe': expected true or false"),
        ({"bootstrap.servers": "h:1", "topic.t.accept.range.fetch": "maybe"},
         "topic.t.accept.range.fetch: invalid value 'maybe': expected true or false"),
        ({"bootstrap.servers": "h:1", "key.range.fetch.enabled": "maybe"}, "key.range.fetch.enabled: invalid value"),
        ({"bootstrap.servers": "h:1", "fetch.readahead.max.bytes": "10"},
         "fetch.readahead.max.bytes: must be at least 1024 (got '10')"),
        ({"bootstrap.servers": "h:1", "virtual.coop.suffix": ".kr"}, "virtual.coop.suffix: must differ"),
        ({"bootstrap.servers": "h:1,h:2", "topology": "sidecar"}, "exactly one broker"),
        ({"bootstrap.servers": "h:1", "ssl.listener.enabled": "true"}, "needs ssl.listener.certfile"),
        ({"bootstrap.servers": "h:1", "ssl.upstream.cafile": "/no/such.pem"}, "no such file"),
        ({"bootstrap.servers": "h:1", "sidecar.node.addresses": "1=h:2"}, "not node_id@host:port"),
        ({"bootstrap.servers": "h:1", "socket.send.buffer.bytes": "0"},
         "socket.send.buffer.bytes: must be -1 (the operating system's default) or at least 4096 (got '0')"),
        ({"bootstrap.servers": "h:1", "socket.send.buffer.bytes": "1MB"}, "socket.send.buffer.bytes: invalid value '1MB'"),
        ({"bootstrap.servers": "h:1", "virtual.topic.max.shares": "65"}, "virtual.topic.max.shares: must be 2..64"),
        ({"bootstrap.servers": "h:1", "virtual.topic.max.shares": "1"}, "virtual.topic.max.shares: must be 2..64"),
    ],
)
def test_mistakes_name_the_key_and_the_problem(entries, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        build_config(entries)


def test_send_buffer_accepts_the_os_default_and_sizes():
    assert build_config({"bootstrap.servers": "h:1"}).limits.socket_send_buffer_bytes == 1048576
    assert build_config({"bootstrap.servers": "h:1", "socket.send.buffer.bytes": "-1"}).limits.socket_send_buffer_bytes == -1
    assert build_config({"bootstrap.servers": "h:1",
                         "socket.send.buffer.bytes": "4096"}).limits.socket_send_buffer_bytes == 4096


def test_properties_syntax_errors_name_the_line():
    with pytest.raises(ConfigError, match="cfg:2: expected key=value"):
        parse_properties("a=1\njust words\n", source="cfg")


def test_missing_file_and_bad_override():
    with pytest.raises(ConfigError, match="does not exist"):
        load_config("/no/such/file.properties", [])
    with pytest.raises(ConfigError, match="expected key=value"):
        load_config(None, ["bootstrap.servers"])


def test_virtual_topic_max_shares_reaches_the_ceiling_watermarks_are_read_with():
    from proxy.commits.state import MAX_SHARES

    config = build_config({"bootstrap.servers": "h:1", "virtual.topic.max.shares": str(MAX_SHARES)})
    assert config.virtual.max_shares == MAX_SHARES == 64


def test_a_file_that_is_not_utf8_is_refused_with_where(tmp_path):
    path = tmp_path / "proxy.properties"
    # ISO-8859-1, as Kafka's tools read properties files: the comment's "ü" is byte 0xfc.
    path.write_bytes("bootstrap.servers=h:1\n# Zürich\nlisten.port=1\n".encode("latin-1"))
    with pytest.raises(ConfigError) as error:
        load_config(str(path), [])
    message = str(error.value)
    assert str(path) in message and "not UTF-8" in message
    assert "byte offset 25 (line 2, column 4) is 0xfc" in message
    # UTF-8, non-ASCII included, is read as written.
    path.write_text("bootstrap.servers=h:1\n# Zürich\nadvertised.host=zürich.example\n", encoding="utf-8")
    assert load_config(str(path), []).advertised_host == "zürich.example"


def test_an_unreadable_file_is_refused_naming_it(tmp_path, monkeypatch):
    from pathlib import Path

    path = tmp_path / "proxy.properties"
    path.write_text("bootstrap.servers=h:1\n")

    def refuse(self):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "read_bytes", refuse)
    with pytest.raises(ConfigError, match="cannot be read: Permission denied"):
        load_config(str(path), [])


def test_sidecar_addresses_parse():
    config = build_config({
        "bootstrap.servers": "127.0.0.1:9092",
        "topology": "sidecar",
        "sidecar.node.addresses": "1@127.0.0.1:19001, 2@127.0.0.1:19002",
    })
    assert config.cluster.sidecar_node_addresses == {1: ("127.0.0.1", 19001), 2: ("127.0.0.1", 19002)}


# -- renamed settings --------------------------------------------------------------------------
RENAMED = {
    "accept.individual.commit": ("individual.commit.enabled", lambda c: c.individual.enabled),
    "key.range.readahead.enabled": ("key.range.prefetch.enabled", lambda c: c.keyrange.prefetch_enabled),
    "fetch.readahead.enabled": ("fetch.prediction.enabled", lambda c: c.prediction.enabled),
    "accept.range.fetch": ("key.range.fetch.enabled", lambda c: c.keyrange.topics.default.fetch_enabled),
}


@pytest.mark.parametrize("old", sorted(RENAMED))
def test_a_former_name_is_read_as_the_new_one_and_reported(old):
    new, read = RENAMED[old]
    default = read(build_config({"bootstrap.servers": "h:1"}))
    flipped = "false" if default else "true"
    config = build_config({"bootstrap.servers": "h:1", old: flipped})
    assert read(config) is (not default)
    assert config.renamed == ((old, new),)
    assert read(build_config({"bootstrap.servers": "h:1", new: flipped})) is (not default)


def test_renamed_limits_and_per_topic_settings_keep_working():
    config = build_config({"bootstrap.servers": "h:1", "fetch.readahead.max.bytes": "2048",
                           "fetch.readahead.max.partitions": "7", "fetch.readahead.buffer.bytes": "4096",
                           "topic.orders.eu.accept.range.fetch": "false"})
    assert (config.prediction.max_bytes, config.prediction.max_partitions, config.prediction.buffer_bytes) == (
        2048, 7, 4096)
    assert config.keyrange.topics.of("orders.eu").fetch_enabled is False
    assert config.keyrange.topics.of("orders").fetch_enabled is True
    assert ("topic.orders.eu.accept.range.fetch", "topic.orders.eu.key.range.fetch.enabled") in config.renamed


def test_with_both_names_the_later_entry_wins_and_an_override_comes_last(tmp_path):
    assert build_config({"bootstrap.servers": "h:1", "accept.individual.commit": "false",
                         "individual.commit.enabled": "true"}).individual.enabled is True
    assert build_config({"bootstrap.servers": "h:1", "individual.commit.enabled": "true",
                         "accept.individual.commit": "false"}).individual.enabled is False
    path = tmp_path / "proxy.properties"
    path.write_text("bootstrap.servers=h:1\nindividual.commit.enabled=false\naccept.individual.commit=false\n")
    assert load_config(str(path), ["individual.commit.enabled=true"]).individual.enabled is True


def test_the_server_warns_once_at_start_naming_the_new_key(caplog):
    import logging

    import trio

    from proxy.server.app import ProxyServer

    config = build_config({"bootstrap.servers": "127.0.0.1:9", "listen.port": "0", "accept.individual.commit": "true",
                           "topic.orders.accept.range.fetch": "true", "upstream.connect.timeout.ms": "1"})
    server = ProxyServer(config)

    async def start_and_stop() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: server.run(handle_signals=False))
            with trio.fail_after(10):
                await server.started.wait()
            server.shutdown()

    with caplog.at_level(logging.WARNING, logger="proxy.server"):
        trio.run(start_and_stop)
    warnings = [r.getMessage() for r in caplog.records if "deprecated" in r.getMessage()]
    assert warnings == [
        "setting accept.individual.commit is deprecated: it is read as individual.commit.enabled; write that instead",
        "setting topic.orders.accept.range.fetch is deprecated: it is read as topic.orders.key.range.fetch.enabled; "
        "write that instead",
    ]


# -- per-topic settings and their proxy-wide default ---------------------------------------------------
def test_a_per_topic_setting_alone_is_the_default_of_every_topic_without_its_own():
    config = build_config({"bootstrap.servers": "h:1", "reserve.message.value.range.fetch": "true",
                           "key.range.fetch.enabled": "false", "topic.orders.key.range.fetch.enabled": "true"})
    topics = config.keyrange.topics
    assert (topics.of("orders").fetch_enabled, topics.of("orders").cache_records) == (True, True)
    assert (topics.of("audit").fetch_enabled, topics.of("audit").cache_records) == (False, True)


def test_every_per_topic_setting_has_a_proxy_wide_default_a_topic_overrides_both_ways():
    from proxy.keyrange.settings import KeyRangeTopicSettings
    from proxy.server.config import SECTIONS
    from proxy.settings import settings_of, topic_groups_of

    groups = [(section, attribute, cls) for section in SECTIONS for attribute, cls in topic_groups_of(section.cls)]
    assert [cls for _, _, cls in groups] == [KeyRangeTopicSettings]  # the only per-topic settings so far
    for section, attribute, cls in groups:
        for spec in settings_of(cls):
            if not isinstance(spec.default, bool):
                continue
            wide, own = str(not spec.default).lower(), str(spec.default).lower()
            config = build_config({"bootstrap.servers": "h:1", spec.name: wide, f"topic.orders.{spec.name}": own})
            topics = getattr(getattr(config, section.attribute), attribute)
            assert getattr(topics.of("audit"), spec.attribute) is (not spec.default), spec.name
            assert getattr(topics.of("orders"), spec.attribute) is spec.default, spec.name
            config = build_config({"bootstrap.servers": "h:1", f"topic.orders.{spec.name}": wide})
            topics = getattr(getattr(config, section.attribute), attribute)
            assert getattr(topics.of("audit"), spec.attribute) is spec.default, spec.name


def test_the_longest_per_topic_setting_that_fits_names_the_topic():
    # "orders.key.range.fetch.enabled": the setting is key.range.fetch.enabled of topic
    # "orders", not a setting of a topic "orders.key.range" (no shorter setting matches)
    config = build_config({"bootstrap.servers": "h:1", "topic.orders.key.range.fetch.enabled": "false"})
    assert set(config.keyrange.topics.topics) == {"orders"}


# -- --help-config ----------------------------------------------------------------------------------
def test_help_lists_every_setting_by_feature_with_former_names():
    from proxy.server.config import describe_settings, every_key

    text = describe_settings()
    for key in every_key():
        assert key.removeprefix("topic.<topic>.") in text
    for title in ("Key-range fetch", "Cooperative fetch", "Fetch prediction", "Individual commit", "Virtual topics",
                  "Native relay", "Connections and their limits"):
        assert f"\n{title}" in text
    assert "key.range.prefetch.enabled (default true; formerly key.range.readahead.enabled, still read)" in text
    assert "bootstrap.servers (required)" in text
    assert "the setting alone is the value of every topic without its own" in text



def test_help_says_what_the_settings_that_cost_most_cost():
    import re

    from proxy.server.config import describe_settings

    text = describe_settings()
    for name in ("reserve.message.value.range.fetch", "max.bytes.key.range.results", "key.range.prefetch.enabled",
                 "fetch.prediction.enabled", "virtual.topics.enabled", "native.relay.threads"):
        entry = re.search(rf"\n {{2,4}}{re.escape(name)} \(.*?(?=\n {{2,4}}[a-z]|\n\n|$)", text, re.S)
        assert entry is not None and re.search(r"\n +Cost: ", entry.group()), name
    assert "reserve.message.value.range.fetch (default true;" in text


def test_every_settings_field_is_declared_once():
    from proxy.keyrange.settings import KeyRangeSettings, KeyRangeTopicSettings
    from proxy.settings import settings_of, topic_groups_of

    assert [spec.name for spec in settings_of(KeyRangeTopicSettings)] == [
        "key.range.fetch.enabled", "reserve.message.value.range.fetch"]
    assert topic_groups_of(KeyRangeSettings) == (("topics", KeyRangeTopicSettings),)


@pytest.mark.parametrize("given", ["debug", "Debug", " DEBUG "])
def test_log_level_is_read_in_any_case(given):
    assert build_config({"bootstrap.servers": "127.0.0.1:9092", "log.level": given}).operations.log_level == "DEBUG"


def test_an_unknown_log_level_is_refused_naming_the_choices():
    with pytest.raises(ConfigError, match="log.level: must be one of DEBUG, INFO, WARNING, ERROR"):
        build_config({"bootstrap.servers": "127.0.0.1:9092", "log.level": "verbose"})
