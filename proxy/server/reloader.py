"""Reloading the settings while the proxy runs: on SIGHUP, or when a watched file changes
(``config.watch.interval.ms``). The trio edge of ``proxy.server.reload``.

A reload is prepared whole before anything changes: the properties file and the overrides
are read as at start, compared with the settings in force (``plan_reload``), and new TLS
contexts are built from the files the result names (a certificate rotated in place, under
the same path, is read anew too). Any mistake refuses the reload: one log line names the
file, key and reason, ``kafka_proxy_config_reloads_total{result="refused"}`` counts it, and
every setting in force stays as it was. Otherwise the server puts the result in force in
steps that cannot fail (``ProxyServer.apply_settings``), and each setting that changed is
logged, those that wait for a restart as warnings.

Reloads run one at a time. The file watch compares the contents of the watched files (the
properties file, and the certificate, key and CA files of the settings in force) with what
the last reload read; a file that changed since is reloaded once, and a refused one is not
tried again until it changes again.
"""

from __future__ import annotations

import hashlib
import logging
import ssl
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import trio
from prometheus_client import CollectorRegistry, Counter, Gauge

from proxy.server.config import ProxyConfig, load_config
from proxy.server.reload import ReloadPlan, plan_reload, shown
from proxy.server.tls import ListenerTls, load_listener_tls, load_upstream_tls
from proxy.settings import ConfigError

log = logging.getLogger("proxy.reload")


@dataclass(frozen=True)
class ConfigSource:
    """Where the settings come from: the properties file (if any) and the overrides, which
    win over it at every reload as at start."""

    path: str | None
    overrides: tuple[str, ...] = ()

    def read(self) -> ProxyConfig:
        return load_config(self.path, list(self.overrides))

    def describe(self) -> str:
        return self.path or "--override arguments"


@dataclass(frozen=True)
class PreparedReload:
    """A reload ready to be put in force: nothing in it can fail any more."""

    plan: ReloadPlan
    listener_tls: ListenerTls | None
    upstream_ssl: ssl.SSLContext | None


def prepare(current: ProxyConfig, new: ProxyConfig) -> PreparedReload:
    """The plan from ``current`` to ``new`` and the TLS contexts of its result, loaded from
    the files (ConfigError when any of it cannot be used)."""
    plan = plan_reload(current, new)
    tls = plan.config.tls
    listener = load_listener_tls(tls.listener_certfile, tls.listener_keyfile) if tls.listener_enabled else None
    upstream = load_upstream_tls(tls.upstream_cafile, tls.upstream_check_hostname) if tls.upstream_enabled else None
    return PreparedReload(plan, listener, upstream)


def watched_files(source: ConfigSource | None, config: ProxyConfig) -> tuple[str, ...]:
    """The files whose change is a reason to reload: the properties file, and the TLS files
    the settings in force name."""
    tls = config.tls
    paths = [source.path] if source is not None and source.path else []
    if tls.listener_enabled:
        paths += [tls.listener_certfile, tls.listener_keyfile]
    if tls.upstream_enabled and tls.upstream_cafile:
        paths.append(tls.upstream_cafile)
    return tuple(dict.fromkeys(paths))


def file_digests(paths: Sequence[str]) -> dict[str, str | None]:
    """SHA-256 of each file's contents (None: missing or unreadable)."""
    digests: dict[str, str | None] = {}
    for path in paths:
        try:
            digests[path] = hashlib.sha256(Path(path).read_bytes()).hexdigest()
        except OSError:
            digests[path] = None
    return digests


class ReloadMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.reloads = Counter("kafka_proxy_config_reloads", "Settings reloads, by result: ok (put in force) or "
                               "refused (a mistake in the file; the settings in force stayed).", ["result"],
                               registry=r)
        self.ok, self.refused = self.reloads.labels("ok"), self.reloads.labels("refused")
        self.generation = Gauge("kafka_proxy_config_generation", "The settings in force: 1 as started, one more "
                                "for each reload put in force.", registry=r)
        self.last_reload = Gauge("kafka_proxy_config_last_reload_timestamp_seconds",
                                 "When the settings in force were read (start, or the last reload put in force), "
                                 "in seconds since the epoch.", registry=r)
        self.restart_pending = Gauge("kafka_proxy_config_restart_pending",
                                     "Settings whose value read at the last reload differs from the one in force "
                                     "and takes a restart to change.", registry=r)
        self.generation.set(1)
        self.last_reload.set(time.time())


class Reloadable(Protocol):
    """What a reload changes (``proxy.server.app.ProxyServer``)."""

    @property
    def config(self) -> ProxyConfig: ...

    @property
    def listener_tls(self) -> ListenerTls | None: ...

    def apply_settings(self, prepared: PreparedReload) -> None: ...


class Reloader:
    def __init__(self, server: Reloadable, source: ConfigSource | None, metrics: ReloadMetrics) -> None:
        self.server = server
        self.source = source
        self.metrics = metrics
        self.generation = 1
        self.polls = 0  # times the watch has looked at the files
        self._lock = trio.Lock()
        self._seen: dict[str, str | None] | None = None  # the watched files' digests when last read

    async def reload(self, trigger: str, config: ProxyConfig | None = None) -> bool:
        """Read the settings anew from the source (or take ``config``, already read) and put
        them in force whole, or refuse them whole. True when put in force."""
        async with self._lock:
            return await self._reload(trigger, config)

    async def _reload(self, trigger: str, config: ProxyConfig | None) -> bool:
        current = self.server.config
        source = self.source
        where = "given settings" if config is not None else "no source" if source is None else source.describe()
        try:
            if config is None:
                if source is None:
                    raise ConfigError("the proxy was started without a properties file or overrides to read again")
                # what is read from here on is what this reload stands for
                self._seen = await trio.to_thread.run_sync(file_digests, watched_files(source, current))
                config = await trio.to_thread.run_sync(source.read)
            prepared = await trio.to_thread.run_sync(prepare, current, config)
        except ConfigError as exc:
            self.metrics.refused.inc()
            log.error("settings reload refused trigger=%s source=%s reason=%s; every setting in force stays as "
                      "it was (generation %s)", trigger, where, exc, self.generation)
            return False
        self._put_in_force(trigger, where, prepared)
        paths = watched_files(source, prepared.plan.config)
        if self._seen is not None and paths != tuple(self._seen):  # other TLS files from now on
            self._seen = await trio.to_thread.run_sync(file_digests, paths)
        return True

    def _put_in_force(self, trigger: str, where: str, prepared: PreparedReload) -> None:
        plan = prepared.plan
        before = self.server.listener_tls
        root = logging.getLogger()
        level = logging.getLevelName(plan.config.operations.log_level)
        self.server.apply_settings(prepared)
        self.generation += 1
        self.metrics.ok.inc()
        self.metrics.generation.set(self.generation)
        self.metrics.last_reload.set(time.time())
        self.metrics.restart_pending.set(len(plan.kept))
        # logged at the more verbose of the two levels, so a reload to WARNING is still told
        root.setLevel(min(root.level or logging.WARNING, level))
        log.info("settings reloaded trigger=%s source=%s generation=%s changed=%s restart_pending=%s", trigger, where,
                 self.generation, ",".join(plan.changed_keys) or "none",
                 ",".join(change.key for change in plan.kept) or "none")
        for change in plan.applied:
            log.info("setting reloaded key=%s old=%s new=%s", change.key, shown(change.old), shown(change.new))
        for change in plan.kept:
            log.warning("setting not reloaded key=%s in_force=%s read=%s reason=changing it needs a restart; the "
                        "value in force stays until then", change.key, shown(change.old), shown(change.new))
        after = prepared.listener_tls
        if after is not None and (before is None or after.fingerprint != before.fingerprint):
            log.info("listener certificate reloaded certfile=%s fingerprint_sha256=%s previous=%s; new TLS "
                     "connections get it, open ones keep theirs", after.certfile, after.fingerprint,
                     before.fingerprint if before is not None else "none")
        root.setLevel(level)

    async def watch(self, interval: float, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Every ``interval`` seconds, reload if a watched file's contents changed since
        the last reload read them (or since start)."""
        if self._seen is None:
            self._seen = await trio.to_thread.run_sync(file_digests, watched_files(self.source, self.server.config))
        task_status.started()
        while True:
            await trio.sleep(interval)
            async with self._lock:  # compared with what the last reload read, whatever triggered it
                digests = await trio.to_thread.run_sync(file_digests, watched_files(self.source, self.server.config))
                seen = self._seen or {}
                changed = [path for path, digest in digests.items() if seen.get(path) != digest]
                if changed:
                    await self._reload(f"watch({','.join(changed)})", None)
            self.polls += 1


__all__ = ["ConfigSource", "PreparedReload", "ReloadMetrics", "Reloader", "file_digests", "prepare",
           "watched_files"]
