"""Reloading a running ProxyServer's settings from its properties file: put in force whole,
or refused whole with a log line naming the file, key and reason (``proxy.server.reloader``).
The server is built but not run: no broker is needed to reload."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
import trio

from harness.certificates import make_ca, make_server_cert
from proxy.server.app import ProxyServer
from proxy.server.config import load_config
from proxy.server.reloader import ConfigSource, file_digests, watched_files

OVERRIDES = ("bootstrap.servers=127.0.0.1:9", "listen.port=0")


@pytest.fixture(scope="module")
def certificates(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tls")
    ca = make_ca(directory)
    return ca, make_server_cert(ca, directory, 7001), make_server_cert(ca, directory, 7002)


@pytest.fixture
def logs(caplog):
    root = logging.getLogger()
    level = root.level
    caplog.set_level(logging.INFO)
    yield caplog
    root.setLevel(level)


class Running:
    """A ProxyServer built from a properties file, and what its reloads did."""

    def __init__(self, tmp_path: Path, text: str, logs) -> None:
        self.path = tmp_path / "proxy.properties"
        self.path.write_text(text)
        self.source = ConfigSource(str(self.path), OVERRIDES)
        self.server = ProxyServer(self.source.read(), source=self.source)
        self.server._main_socket.close()
        self.logs = logs

    def write(self, text: str) -> None:
        self.path.write_text(text)

    def metric(self, name: str, **labels: str) -> float | None:
        return self.server.metrics.registry.get_sample_value(name, labels or None)

    def lines(self, level: int = logging.INFO) -> list[str]:
        return [r.getMessage() for r in self.logs.records if r.name == "proxy.reload" and r.levelno == level]


@pytest.fixture
def running(tmp_path, logs):
    def start(text: str) -> Running:
        return Running(tmp_path, text, logs)
    return start


async def test_a_reload_puts_the_new_values_in_force(running):
    proxy = running("max.connections=5\nqueued.max.request.bytes=2097152\nmax.bytes.key.range.results=4096\n")
    server = proxy.server
    assert server.request_budget.limit == 2097152
    proxy.write("max.connections=7\nqueued.max.request.bytes=4194304\nmax.bytes.key.range.results=1024\n"
                "topic.orders.key.range.fetch.enabled=false\nupstream.connect.timeout.ms=1500\n")
    assert await server.reloader.reload("test") is True
    assert server.config.limits.max_connections == 7
    assert server.request_budget.limit == 4194304
    assert server._keyrange.engine.cache.max_bytes == 1024
    assert server._keyrange.engine.topic_settings("orders").fetch_enabled is False
    assert server._keyrange.engine.topic_settings("other").fetch_enabled is True
    assert server.pool.timeout == 1.5
    assert proxy.metric("kafka_proxy_config_reloads_total", result="ok") == 1
    assert proxy.metric("kafka_proxy_config_reloads_total", result="refused") == 0
    assert proxy.metric("kafka_proxy_config_generation") == 2
    assert proxy.metric("kafka_proxy_config_restart_pending") == 0
    lines = proxy.lines()
    assert lines[0].startswith(f"settings reloaded trigger=test source={proxy.path} generation=2 changed=")
    assert "setting reloaded key=max.connections old=5 new=7" in lines
    assert "setting reloaded key=topic.orders.key.range.fetch.enabled old=true new=false" in lines


async def test_the_overrides_keep_winning_over_the_file(running):
    proxy = running("max.connections=5\n")
    proxy.source = ConfigSource(str(proxy.path), (*OVERRIDES, "max.connections=9"))
    proxy.server.reloader.source = proxy.source
    proxy.write("max.connections=6\n")
    assert await proxy.server.reloader.reload("test")
    assert proxy.server.config.limits.max_connections == 9


@pytest.mark.parametrize("text, reason", [
    ("max.connections=7\nthis line has no separator\n", "proxy.properties:2: expected key=value, got "
                                                       "'this line has no separator'"),
    ("max.connections=7\nmax.conections=8\n", "max.conections: unknown setting"),
    ("max.connections=7\nmax.connections=0\n", "max.connections: must be at least 1 (got '0')"),
    ("max.connections=7\nlog.level=LOUD\n", "log.level: must be one of DEBUG, INFO, WARNING, ERROR (got 'LOUD')"),
    ("max.connections=7\nssl.listener.enabled=true\n", "ssl.listener.enabled: needs ssl.listener.certfile"),
])
async def test_a_bad_file_is_refused_whole(running, text, reason):
    proxy = running("max.connections=5\n")
    before = proxy.server.config
    proxy.write(text)
    assert await proxy.server.reloader.reload("SIGHUP") is False
    assert proxy.server.config is before
    assert proxy.metric("kafka_proxy_config_reloads_total", result="refused") == 1
    assert proxy.metric("kafka_proxy_config_generation") == 1
    (line,) = proxy.lines(logging.ERROR)
    assert line.startswith(f"settings reload refused trigger=SIGHUP source={proxy.path} reason=")
    assert reason in line
    assert line.endswith("; every setting in force stays as it was (generation 1)")


async def test_a_missing_file_is_refused(running):
    proxy = running("max.connections=5\n")
    proxy.path.unlink()
    assert await proxy.server.reloader.reload("SIGHUP") is False
    (line,) = proxy.lines(logging.ERROR)
    assert f"reason=config file {str(proxy.path)!r} does not exist" in line


async def test_restart_only_settings_are_reported_and_kept(running):
    proxy = running("node.port.base=20000\n")
    proxy.write("node.port.base=30000\nmax.connections=3\n")
    assert await proxy.server.reloader.reload("test")
    assert proxy.server.config.cluster.node_port_base == 20000
    assert proxy.server.config.limits.max_connections == 3
    assert proxy.metric("kafka_proxy_config_restart_pending") == 1
    assert proxy.lines(logging.WARNING) == [
        "setting not reloaded key=node.port.base in_force=20000 read=30000 reason=changing it needs a restart; the "
        "value in force stays until then"]


def _tls(directory: Path, cert: Path, key: Path) -> str:
    return f"ssl.listener.enabled=true\nssl.listener.certfile={cert}\nssl.listener.keyfile={key}\n"


async def test_a_certificate_rotated_in_place_is_served_to_new_connections(running, certificates, tmp_path):
    _, first, second = certificates
    cert, key = tmp_path / "server.pem", tmp_path / "server.key"
    shutil.copy(first.cert, cert)
    shutil.copy(first.key, key)
    proxy = running(_tls(tmp_path, cert, key))
    old = proxy.server.listener_tls
    assert old is not None
    shutil.copy(second.cert, cert)
    shutil.copy(second.key, key)
    assert await proxy.server.reloader.reload("SIGHUP")
    new = proxy.server.listener_tls
    assert new is not None and new.context is not old.context and new.fingerprint != old.fingerprint
    assert (f"listener certificate reloaded certfile={cert} fingerprint_sha256={new.fingerprint} "
            f"previous={old.fingerprint}; new TLS connections get it, open ones keep theirs") in proxy.lines()


async def test_a_key_that_does_not_match_keeps_the_old_certificate(running, certificates, tmp_path):
    _, first, second = certificates
    proxy = running(_tls(tmp_path, first.cert, first.key))
    old = proxy.server.listener_tls
    proxy.write(_tls(tmp_path, second.cert, first.key) + "max.connections=3\n")
    assert await proxy.server.reloader.reload("SIGHUP") is False
    assert proxy.server.listener_tls is old
    assert proxy.server.config.limits.max_connections == 10000, "nothing of a refused file goes in force"
    (line,) = proxy.lines(logging.ERROR)
    assert (f"reason=ssl.listener.keyfile: the key in {str(first.key)!r} does not match the certificate in "
            f"{str(second.cert)!r}") in line


async def test_a_new_log_level_is_in_force_after_its_reload_is_logged(running):
    proxy = running("log.level=INFO\n")
    proxy.write("log.level=WARNING\n")
    assert await proxy.server.reloader.reload("SIGHUP")
    assert "setting reloaded key=log.level old=INFO new=WARNING" in proxy.lines()
    assert logging.getLogger().level == logging.WARNING
    proxy.write("log.level=DEBUG\n")
    assert await proxy.server.reloader.reload("SIGHUP")
    assert "setting reloaded key=log.level old=WARNING new=DEBUG" in proxy.lines()
    assert logging.getLogger().level == logging.DEBUG


async def test_reloads_run_one_at_a_time(running):
    proxy = running("max.connections=5\n")
    proxy.write("max.connections=6\n")
    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(proxy.server.reloader.reload, "SIGHUP")
    assert proxy.metric("kafka_proxy_config_generation") == 4
    generations = [line.split("generation=")[1].split()[0] for line in proxy.lines() if "generation=" in line]
    assert generations == ["2", "3", "4"]


def test_the_watched_files_are_the_properties_file_and_the_tls_files_in_force(tmp_path, certificates):
    ca, first, _ = certificates
    path = tmp_path / "p.properties"
    path.write_text(_tls(tmp_path, first.cert, first.key) + f"ssl.upstream.enabled=true\nssl.upstream.cafile={ca.cert}\n")
    source = ConfigSource(str(path), OVERRIDES)
    config = load_config(str(path), list(OVERRIDES))
    assert watched_files(source, config) == (str(path), str(first.cert), str(first.key), str(ca.cert))
    assert watched_files(None, config) == (str(first.cert), str(first.key), str(ca.cert))
    digests = file_digests([str(path), str(tmp_path / "missing")])
    assert len(digests[str(path)] or "") == 64 and digests[str(tmp_path / "missing")] is None


async def _polls(reloader, count: int) -> None:
    target = reloader.polls + count
    with trio.fail_after(10):
        while reloader.polls < target:
            await trio.sleep(0.01)


async def test_the_watch_reloads_a_changed_file_once_and_a_refused_one_until_it_changes(running):
    proxy = running("max.connections=5\n")
    reloader = proxy.server.reloader
    async with trio.open_nursery() as nursery:
        await nursery.start(reloader.watch, 0.02)
        await _polls(reloader, 3)
        assert proxy.metric("kafka_proxy_config_generation") == 1, "an unchanged file is not reloaded"
        proxy.write("max.connections=6\n")
        await _polls(reloader, 3)
        assert proxy.server.config.limits.max_connections == 6
        assert proxy.metric("kafka_proxy_config_reloads_total", result="ok") == 1
        proxy.write("max.connections=zero\n")
        await _polls(reloader, 3)
        assert proxy.metric("kafka_proxy_config_reloads_total", result="refused") == 1, "refused once, not again"
        assert proxy.server.config.limits.max_connections == 6
        proxy.write("max.connections=8\n")
        await _polls(reloader, 3)
        assert proxy.server.config.limits.max_connections == 8
        assert proxy.metric("kafka_proxy_config_reloads_total", result="ok") == 2
        nursery.cancel_scope.cancel()
    assert any(line.startswith(f"settings reloaded trigger=watch({proxy.path})") for line in proxy.lines())


async def test_a_sighup_reload_is_not_repeated_by_the_watch(running):
    proxy = running("max.connections=5\n")
    reloader = proxy.server.reloader
    async with trio.open_nursery() as nursery:
        await nursery.start(reloader.watch, 0.02)
        proxy.write("max.connections=6\n")
        await reloader.reload("SIGHUP")
        await _polls(reloader, 3)
        nursery.cancel_scope.cancel()
    assert proxy.metric("kafka_proxy_config_reloads_total", result="ok") == 1
