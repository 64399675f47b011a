"""What a reload changes: settings read anew, against those in force (sans-IO).

A reload reads the properties file and the ``--override`` arguments again, as at start, so
a mistake in them is the ConfigError start-up would give (naming the file and line, or the
key and the problem). ``plan_reload`` then compares the result with the settings in force,
setting by setting and topic by topic:

- a setting declared ``reloadable`` (``proxy.settings``) takes its new value;
- any other keeps the value the proxy started with (its ports, the cluster, the features
  switched on, ...): the difference is reported, so the operator knows it waits for a
  restart, and it is reported again at every reload until then.

The outcome is one new ProxyConfig, whose sections are checked again as wholes (a new value
must fit the restart-only values that stay), or a ConfigError: a refused reload changes
nothing. The I/O (reading the files, building TLS contexts, swapping what the server uses)
is ``proxy.server.reloader``'s.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from proxy.server.config import SECTIONS, ProxyConfig
from proxy.settings import ConfigError, PerTopic, Settings, settings_of, topic_groups_of


@dataclass(frozen=True)
class Change:
    """One setting whose value read anew differs from the value in force."""

    key: str  # as written in the properties file: ``max.connections``, ``topic.orders.key.range.fetch.enabled``
    old: Any  # in force before the reload
    new: Any  # read anew
    reloadable: bool

    def describe(self) -> str:
        return f"{self.key}: {shown(self.old)} -> {shown(self.new)}"


@dataclass(frozen=True)
class ReloadPlan:
    config: ProxyConfig  # the settings to put in force
    applied: tuple[Change, ...]  # reloadable settings whose new value goes in force
    kept: tuple[Change, ...]  # restart-only settings whose new value waits for a restart

    @property
    def changed_keys(self) -> tuple[str, ...]:
        return tuple(change.key for change in self.applied)


def plan_reload(current: ProxyConfig, new: ProxyConfig) -> ReloadPlan:
    """The settings to put in force when ``new`` has been read while ``current`` is in
    force: ``new``'s value of every reloadable setting, ``current``'s of every other.
    ConfigError when that mix fails a section's checks."""
    applied: list[Change] = []
    kept: list[Change] = []
    sections: dict[str, Any] = {}
    for section in SECTIONS:
        waiting = len(kept)
        merged = _merge(section.cls, getattr(current, section.attribute), getattr(new, section.attribute),
                        _as_written, applied, kept)
        sections[section.attribute] = _checked(merged, kept[waiting:])
    return ReloadPlan(dataclasses.replace(new, **sections), tuple(applied), tuple(kept))


def reloadable_keys() -> tuple[str, ...]:
    """Every setting a reload puts in force (per-topic ones by their name alone)."""
    keys: list[str] = []

    def walk(cls: type) -> None:
        keys.extend(spec.name for spec in settings_of(cls) if spec.reloadable)
        for _, topic_cls in topic_groups_of(cls):
            walk(topic_cls)

    for section in SECTIONS:
        walk(section.cls)
    return tuple(keys)


def shown(value: Any) -> str:
    """A setting's value as it is written in a properties file."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list) and all(isinstance(item, tuple) and len(item) == 2 for item in value):
        return ",".join(f"{host}:{port}" for host, port in value)
    if isinstance(value, dict):
        return ",".join(f"{node}@{host}:{port}" for node, (host, port) in value.items())
    if value == "":
        return '""'
    return str(value)


# -- merging, class by class ---------------------------------------------------------------------------
def _as_written(name: str) -> str:
    return name


def _of_topic(topic: str) -> Callable[[str], str]:
    return lambda name: f"topic.{topic}.{name}"


def _merge(cls: type[Settings], old: Any, new: Any, key_of: Callable[[str], str],
           applied: list[Change], kept: list[Change]) -> Any:
    """``new`` with ``old``'s value of every setting that is not reloadable; each difference
    recorded in ``applied`` or ``kept``."""
    values: dict[str, Any] = {}
    for spec in settings_of(cls):
        before, after = getattr(old, spec.attribute), getattr(new, spec.attribute)
        if before == after:
            continue
        change = Change(key_of(spec.name), before, after, spec.reloadable)
        if spec.reloadable:
            applied.append(change)
        else:
            kept.append(change)
            values[spec.attribute] = before
    for attribute, topic_cls in topic_groups_of(cls):
        values[attribute] = _merge_topics(topic_cls, getattr(old, attribute), getattr(new, attribute), applied, kept)
    return dataclasses.replace(new, **values) if values else new


def _merge_topics(cls: type[Settings], old: PerTopic[Any], new: PerTopic[Any],
                  applied: list[Change], kept: list[Change]) -> PerTopic[Any]:
    """Per-topic settings compared as they apply: the default of every topic, then each
    topic named on either side by what it gets (its own values, or the default's)."""
    default = _checked(_merge(cls, old.default, new.default, _as_written, applied, kept), ())
    topics: dict[str, Any] = {}
    for topic in sorted(old.topics.keys() | new.topics.keys()):
        merged = _merge(cls, old.of(topic), new.of(topic), _of_topic(topic), applied, kept)
        if topic in new.topics or merged != default:  # a topic no longer named keeps an entry only to hold
            topics[topic] = _checked(merged, ())      # a restart-only value
    return PerTopic(default, topics)


def _checked(settings: Any, kept: tuple[Change, ...] | list[Change]) -> Any:
    try:
        return settings.checked()
    except ConfigError as exc:
        if not kept:
            raise
        waiting = ", ".join(change.key for change in kept)
        raise ConfigError(f"{exc} (with {waiting} as in force: changing it needs a restart)") from None


__all__ = ["Change", "ReloadPlan", "plan_reload", "reloadable_keys", "shown"]
