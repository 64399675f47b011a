"""Configuration: every mistake is refused at start with the key and the problem named."""

import pytest

from proxy.server.config import ConfigError, build_config, load_config, parse_properties


def test_defaults_follow_the_design_contract():
    config = build_config({"bootstrap.servers": "127.0.0.1:9092"})
    assert config.get("max.bytes.key.range.results") == 209715200
    assert config.get("accept.individual.commit") is True
    assert config.get("individual.commit.log.segment.bytes") == 10485760
    assert config.get("max.individual.commit.ranges.held") == 10000
    assert config.get("max.frame.bytes") == 100 * 1024 * 1024
    assert config.topic_setting("orders", "accept.range.fetch") is True
    assert config.topic_setting("orders", "reserve.message.value.range.fetch") is False
    assert config.get("node.port.base") == config.get("listen.port") + 1


def test_properties_file_with_comments_continuations_and_overrides(tmp_path):
    path = tmp_path / "proxy.properties"
    path.write_text(
        "# the cluster\n"
        "bootstrap.servers=127.0.0.1:9092,\\\n"
        "   127.0.0.1:9093\n"
        "! another comment\n"
        "listen.port: 19092\n"
        "topic.orders.eu.accept.range.fetch=false\n"
    )
    config = load_config(str(path), ["listen.port=29092", "max.connections=5"])
    assert config.get("bootstrap.servers") == [("127.0.0.1", 9092), ("127.0.0.1", 9093)]
    assert config.get("listen.port") == 29092
    assert config.get("max.connections") == 5
    # topic names may contain dots: the setting is matched as a suffix
    assert config.topic_setting("orders.eu", "accept.range.fetch") is False
    assert config.topic_setting("orders", "accept.range.fetch") is True


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
        ({"bootstrap.servers": "h:1", "topic.t.accept.range.fetch": "maybe"}, "expected true or false"),
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
    assert build_config({"bootstrap.servers": "h:1"}).get("socket.send.buffer.bytes") == 1048576
    assert build_config({"bootstrap.servers": "h:1", "socket.send.buffer.bytes": "-1"}).get("socket.send.buffer.bytes") == -1
    assert build_config({"bootstrap.servers": "h:1", "socket.send.buffer.bytes": "4096"}).get(
        "socket.send.buffer.bytes") == 4096


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
    assert config.get("virtual.topic.max.shares") == MAX_SHARES == 64


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
    assert config.get("sidecar.node.addresses") == {1: ("127.0.0.1", 19001), 2: ("127.0.0.1", 19002)}
