"""Proxy configuration: a Kafka-style properties file plus ``--override key=value``.

Each feature declares its settings as a typed, frozen dataclass (``proxy.settings``);
``ProxyConfig`` composes them, one section per feature, and hands each feature its own.
Every key is declared once, with its type, default and a check, so an unknown key or a bad
value fails at start with a message that names the key and the problem, never later and
never silently.

Per-topic settings are written ``topic.<topic name>.<setting>`` (topic names may
themselves contain dots; the setting is matched as a suffix, the longest that fits); the
same setting written alone, ``<setting>``, is the value of every topic without its own.

A renamed setting's former name is still read, as the new one, and the proxy names the
new key in a warning at start (``ProxyConfig.renamed``). Where an entry is given under
both names, the later one wins, as an override wins over the file.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from proxy.commits.settings import CommitLogSettings
from proxy.coop.settings import CooperativeFetchSettings
from proxy.individual.settings import IndividualCommitSettings
from proxy.keyrange.settings import KeyRangeSettings
from proxy.prediction.settings import FetchPredictionSettings
from proxy.server.settings import (
    ClusterSettings,
    ConnectionLimits,
    NativeRelaySettings,
    OperationsSettings,
    TlsSettings,
)
from proxy.settings import ConfigError, PerTopic, Setting, Settings, make, settings_of, topic_groups_of
from proxy.virtual.settings import VirtualTopicsSettings

_TITLE = "keyrange.section"


def _section(title: str) -> Any:
    return field(metadata={_TITLE: title})


@dataclass(frozen=True)
class ProxyConfig:
    """Every setting, checked and typed: one object per feature (or part of the server)."""

    cluster: ClusterSettings = _section("Cluster, listeners and topology")
    tls: TlsSettings = _section("TLS")
    limits: ConnectionLimits = _section("Connections and their limits")
    native_relay: NativeRelaySettings = _section("Native relay (docs/proxy.md#the-native-relay)")
    operations: OperationsSettings = _section("Metrics, logs, memory, shutdown and reloads")
    keyrange: KeyRangeSettings = _section("Key-range fetch (docs/proxy.md#key-range-fetch)")
    individual: IndividualCommitSettings = _section("Individual commit (docs/individual-commit.md)")
    commit_log: CommitLogSettings = _section("The commit log, __individual_commit_offsets (docs/individual-commit.md)")
    coop: CooperativeFetchSettings = _section("Cooperative fetch (docs/cooperative-fetch.md)")
    prediction: FetchPredictionSettings = _section("Fetch prediction (docs/fetch-prediction.md)")
    virtual: VirtualTopicsSettings = _section("Virtual topics (docs/virtual-topics.md)")
    # (the key as written, the key it now is): renamed settings this configuration used
    renamed: tuple[tuple[str, str], ...] = ()

    @property
    def advertised_host(self) -> str:
        return self.cluster.advertised_host


@dataclass(frozen=True)
class _Section:
    attribute: str
    title: str
    cls: type[Settings]


def _declared_sections() -> tuple[_Section, ...]:
    hints = typing.get_type_hints(ProxyConfig)
    return tuple(_Section(f.name, f.metadata[_TITLE], hints[f.name]) for f in fields(ProxyConfig) if _TITLE in f.metadata)


SECTIONS = _declared_sections()


# -- every key the proxy reads ---------------------------------------------------------------------
@dataclass(frozen=True)
class _Scalar:
    section: _Section
    setting: Setting


@dataclass(frozen=True)
class _TopicGroup:
    section: _Section
    attribute: str  # the per_topic field of the section's class
    cls: type[Settings]


def _index() -> tuple[dict[str, _Scalar], dict[str, tuple[_TopicGroup, Setting]]]:
    """Every proxy-wide key, and every per-topic setting name, former names included. A
    per-topic setting's name is also a proxy-wide key: the default of every topic."""
    scalars: dict[str, _Scalar] = {}
    per_topic: dict[str, tuple[_TopicGroup, Setting]] = {}

    def claim(table: dict, name: str, entry: Any) -> None:
        if name in table or name in scalars or name in per_topic:
            raise TypeError(f"setting {name} is declared twice")
        table[name] = entry

    for section in SECTIONS:
        for spec in settings_of(section.cls):
            for name in (spec.name, *spec.aliases):
                claim(scalars, name, _Scalar(section, spec))
        for attribute, cls in topic_groups_of(section.cls):
            group = _TopicGroup(section, attribute, cls)
            for spec in settings_of(cls):
                for name in (spec.name, *spec.aliases):
                    claim(per_topic, name, (group, spec))
    return scalars, per_topic


_SCALARS, _PER_TOPIC = _index()
# longest first: a topic name may end in what is itself a shorter setting's name
_PER_TOPIC_BY_LENGTH = sorted(_PER_TOPIC, key=len, reverse=True)


def _per_topic_key(rest: str) -> tuple[str, str] | None:
    """``<topic>.<setting>`` -> (topic, setting name as written), or None."""
    for name in _PER_TOPIC_BY_LENGTH:
        suffix = "." + name
        if rest.endswith(suffix) and len(rest) > len(suffix):
            return rest[: -len(suffix)], name
    return None


def build_config(entries: Mapping[str, str]) -> ProxyConfig:
    """Check every entry; unknown keys are errors, so a typo never goes unnoticed."""
    values: dict[str, dict[str, Any]] = {section.attribute: {} for section in SECTIONS}
    topic_defaults: dict[tuple[str, str], dict[str, Any]] = {}  # (section, field) -> values by setting name
    topic_values: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}  # ... -> topic -> values
    renamed: dict[str, str] = {}
    for key, raw in entries.items():
        scalar = _SCALARS.get(key)
        if scalar is not None:
            spec = scalar.setting
            values[scalar.section.attribute][spec.name] = spec.read(raw, key)
            if key != spec.name:
                renamed[key] = spec.name
            continue
        wide = _PER_TOPIC.get(key)
        if wide is not None:
            group, spec = wide
            topic_defaults.setdefault((group.section.attribute, group.attribute), {})[spec.name] = spec.read(raw, key)
            if key != spec.name:
                renamed[key] = spec.name
            continue
        if key.startswith("topic."):
            found = _per_topic_key(key[len("topic."):])
            if found is None:
                known = ", ".join(sorted(name for name, (_, spec) in _PER_TOPIC.items() if name == spec.name))
                raise ConfigError(f"{key}: unknown per-topic setting; write topic.<name>.<setting> with one of {known}")
            topic, written = found
            group, spec = _PER_TOPIC[written]
            per_topic = topic_values.setdefault((group.section.attribute, group.attribute), {})
            per_topic.setdefault(topic, {})[spec.name] = spec.read(raw, key)
            if written != spec.name:
                renamed[key] = f"topic.{topic}.{spec.name}"
            continue
        raise ConfigError(f"{key}: unknown setting (see `keyrange-proxy --help-config`)")
    sections: dict[str, Any] = {}
    for section in SECTIONS:
        tables: dict[str, PerTopic[Any]] = {}
        for attribute, cls in topic_groups_of(section.cls):
            where = (section.attribute, attribute)
            default = make(cls, topic_defaults.get(where, {}))
            own = topic_values.get(where, {})
            tables[attribute] = PerTopic(default, {
                topic: make(cls, {**topic_defaults.get(where, {}), **topic_own}) for topic, topic_own in own.items()})
        sections[section.attribute] = make(section.cls, values[section.attribute], tables)
    return ProxyConfig(**sections, renamed=tuple(renamed.items()))


def parse_properties(text: str, source: str = "<properties>") -> dict[str, str]:
    """Java properties, the subset Kafka configs use: ``key=value`` or ``key: value``,
    ``#``/``!`` comments, blank lines, trailing-backslash continuations."""
    entries: dict[str, str] = {}
    pending = ""
    for number, raw in enumerate(text.splitlines(), start=1):
        line = pending + raw.strip()
        pending = ""
        if not line or line[0] in "#!":
            continue
        if line.endswith("\\"):
            pending = line[:-1]
            continue
        separator_index = next((i for i, char in enumerate(line) if char in "=:"), -1)
        if separator_index < 0:
            raise ConfigError(f"{source}:{number}: expected key=value, got {raw.strip()!r}")
        key = line[:separator_index].strip()
        if not key:
            raise ConfigError(f"{source}:{number}: empty key")
        entries[key] = line[separator_index + 1 :].strip()
    return entries


def load_config(path: str | None, overrides: list[str]) -> ProxyConfig:
    entries: dict[str, str] = {}
    if path:
        entries.update(parse_properties(_read_properties(path), source=path))
    for override in overrides:
        key, sep, value = override.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--override {override!r}: expected key=value")
        key = key.strip()
        entries.pop(key, None)  # an override comes after the file's entries: it wins over a former name there
        entries[key] = value.strip()
    return build_config(entries)


def _read_properties(path: str) -> str:
    """The properties file's text. It must be UTF-8: a file that is not is ConfigError
    naming it and its first byte that is not.

    Kafka reads properties files as ISO-8859-1 (``Utils.loadProps`` calls
    ``Properties.load(InputStream)``) and writes anything beyond it as ``\\uXXXX``, an
    escape this reader does not take. The two encodings agree on ASCII, which every setting
    name and nearly every value is, so a file Kafka's tools read reads the same here unless
    it holds a non-ASCII byte. There they disagree, and taking ISO-8859-1 would misread
    silently: every byte is valid ISO-8859-1, so a UTF-8 file (what editors and shells write,
    and what ``--override`` arguments arrive as) with a non-ASCII host name or path would give
    other characters, advertised to clients or looked up as a file that is not there. UTF-8
    refuses an ISO-8859-1 byte instead, at start, where it is."""
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"config file {path!r} does not exist")
    try:
        data = file.read_bytes()
    except OSError as exc:
        raise ConfigError(f"config file {path!r} cannot be read: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise ConfigError(
            f"config file {path!r} is not UTF-8: at byte offset {exc.start} (line {line}, column {column}) is "
            f"0x{data[exc.start]:02x}, {exc.reason}; the proxy reads its properties file as UTF-8 "
            f"(Kafka's tools read ISO-8859-1; the two agree on ASCII only)"
        ) from None


# -- --help-config -----------------------------------------------------------------------------------
def every_key(*, former: bool = False) -> list[str]:
    """Every setting name the proxy reads, former names too if ``former``; per-topic ones
    both alone (the default of every topic) and as ``topic.<topic>.<setting>``."""
    keys = [name for name, scalar in _SCALARS.items() if former or name == scalar.setting.name]
    per_topic = [name for name, (_, spec) in _PER_TOPIC.items() if former or name == spec.name]
    return keys + per_topic + [f"topic.<topic>.{name}" for name in per_topic]


def _describe(spec: Setting) -> str:
    shown = str(spec.default).lower() if isinstance(spec.default, bool) else repr(spec.default)
    default = "required" if spec.required else f"default {shown}"
    former = f"; formerly {', '.join(spec.aliases)}, still read" if spec.aliases else ""
    former += "; reloadable" if spec.reloadable else ""
    cost = f"\n      Cost: {spec.cost}" if spec.cost else ""
    return f"  {spec.name} ({default}{former})\n      {spec.doc}{cost}"


def describe_settings() -> str:
    lines = ["Proxy settings (properties file or --override key=value), by feature.",
             "Those marked reloadable take a new value from the properties file on SIGHUP, or when "
             "config.watch.interval.ms sees the file change; the others keep theirs until a restart."]
    for section in SECTIONS:
        lines += ["", f"{section.title}:"]
        lines += [_describe(spec) for spec in settings_of(section.cls)]
        for _, cls in topic_groups_of(section.cls):
            lines.append("  Per topic, written topic.<topic name>.<setting>; the setting alone is the value of every "
                         "topic without its own:")
            lines += ["  " + _describe(spec).replace("\n", "\n  ") for spec in settings_of(cls)]
    return "\n".join(lines)
