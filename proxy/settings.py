"""Typed settings: each feature declares its own, as a frozen dataclass.

    @dataclass(frozen=True)
    class CooperativeFetchSettings(Settings):
        enabled: bool = flag("cooperative.fetch.enabled", True, "Hand out chunks of offsets ...")
        lease_ms: int = integer("cooperative.fetch.lease.ms", 45000, "How long a member ...", at_least(100))

A field's setting name, how its text is parsed and checked, its default and its help text
are declared once, on the field. The server composes the classes
(``proxy.server.config.ProxyConfig``): it reads the properties entries into them, lists
them in ``--help-config`` and hands each feature its own object, so a feature reads
``settings.lease_ms``, which mypy checks, never a string key.

Settings that may differ per topic are declared the same way in a class of their own,
which a feature's settings hold as one field, ``per_topic(TheClass)``: the entry
``topic.<topic name>.<setting>`` sets a topic's value, and ``<setting>`` alone sets the
value of every topic that has none of its own (``PerTopic.of``).

A renamed setting keeps its old names as ``aliases``: still read, with a warning at start
naming the new key.

A setting the running proxy can take without a restart is declared ``reloadable=True``: a
reload (SIGHUP, or ``config.watch.interval.ms``) puts its new value in force; any other
setting keeps the value it started with until a restart (``proxy.server.reload``).

A setting whose value costs memory, CPU or broker reads says what, measured where it can
be, in ``cost``: ``--help-config`` prints it under the setting's help, so whoever changes
a default sees its price.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Self, TypeVar, cast

T = TypeVar("T")
S = TypeVar("S", bound="Settings")

Check = Callable[[Any], "str | None"]

_SETTING = "keyrange.setting"  # a field's metadata key: its Setting
_PER_TOPIC = "keyrange.per_topic"  # ...or the settings class it holds per topic


class ConfigError(ValueError):
    """A configuration mistake, phrased for the person who made it."""


# -- parsing and checks ----------------------------------------------------------------------------
def parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("true", "yes", "1", "on"):
        return True
    if lowered in ("false", "no", "0", "off"):
        return False
    raise ValueError("expected true or false")


def parse_int(text: str) -> int:
    return int(text.strip().replace("_", ""), 0)


def parse_str(text: str) -> str:
    return text.strip()


def _no_check(value: Any) -> str | None:
    return None


def at_least(minimum: int) -> Check:
    return lambda value: None if value >= minimum else f"must be at least {minimum}"


def within(minimum: int, maximum: int) -> Check:
    return lambda value: None if minimum <= value <= maximum else f"must be {minimum}..{maximum}"


def one_of(*choices: str) -> Check:
    return lambda value: None if value in choices else f"must be one of {', '.join(choices)}"


def not_empty(value: str) -> str | None:
    return None if value else "must not be empty"


def port(value: int) -> str | None:
    return None if 0 <= value < 65536 else "must be a port number in 0..65535 (0 picks a free port)"


# -- declaring ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Setting:
    """One setting: its name, how its text becomes a value, the default, its help text."""

    name: str
    parse: Callable[[str], Any]
    default: Any
    doc: str
    check: Check = _no_check
    aliases: tuple[str, ...] = ()  # former names: still read, with a warning at start
    required: str = ""  # if set, the setting has no default: what to tell someone who left it out
    reloadable: bool = False  # a reload puts a new value in force; otherwise it waits for a restart
    cost: str = ""  # what its value costs (memory, CPU, broker reads), for --help-config
    attribute: str = ""  # the field it fills (set by ``settings_of``)

    def read(self, raw: str, label: str) -> Any:
        """``raw`` parsed and checked; ``label`` (the key as written) names it in errors."""
        try:
            value = self.parse(raw)
        except ValueError as exc:
            raise ConfigError(f"{label}: invalid value {raw!r}: {exc}") from None
        problem = self.check(value)
        if problem:
            raise ConfigError(f"{label}: {problem} (got {raw!r})")
        return value


def setting(name: str, default: T, doc: str, parse: Callable[[str], T], check: Check = _no_check, *,
            aliases: tuple[str, ...] = (), required: str = "", reloadable: bool = False, cost: str = "") -> T:
    """A dataclass field that is the setting ``name`` (``required``: ``default`` only stands
    in for a value that must be given, and this says how to give it; ``reloadable``: the
    running proxy takes a new value without a restart; ``cost``: what its value costs in
    memory, CPU or broker reads)."""
    spec = Setting(name, parse, default, doc, check, aliases, required, reloadable, cost)
    metadata = {_SETTING: spec}
    if default.__class__.__hash__ is None:  # a list or dict: each instance gets its own
        return cast(T, dataclasses.field(default_factory=lambda: copy.copy(default), metadata=metadata))
    return cast(T, dataclasses.field(default=default, metadata=metadata))


def flag(name: str, default: bool, doc: str, *, aliases: tuple[str, ...] = (), reloadable: bool = False,
         cost: str = "") -> bool:
    return setting(name, default, doc, parse_bool, aliases=aliases, reloadable=reloadable, cost=cost)


def integer(name: str, default: int, doc: str, check: Check = _no_check, *, aliases: tuple[str, ...] = (),
            reloadable: bool = False, cost: str = "") -> int:
    return setting(name, default, doc, parse_int, check, aliases=aliases, reloadable=reloadable, cost=cost)


def text(name: str, default: str, doc: str, check: Check = _no_check, *, aliases: tuple[str, ...] = (),
         reloadable: bool = False, cost: str = "") -> str:
    return setting(name, default, doc, parse_str, check, aliases=aliases, reloadable=reloadable, cost=cost)


def choice(name: str, default: str, choices: tuple[str, ...], doc: str, *, reloadable: bool = False,
           cost: str = "") -> str:
    return setting(name, default, doc, parse_str, one_of(*choices), reloadable=reloadable, cost=cost)


class Settings:
    """Base of every settings class (a frozen dataclass whose fields are declared with
    ``flag``, ``integer``, ``text``, ``choice``, ``setting`` or ``per_topic``)."""

    def checked(self) -> Self:
        """Checks between fields, raising ConfigError naming the key; the object to use
        (a class may fill in a default derived from another field)."""
        return self


@dataclass(frozen=True)
class PerTopic(Generic[S]):
    """A feature's per-topic settings: each topic's own, and what the others get."""

    default: S  # every topic without a value of its own
    topics: Mapping[str, S] = dataclasses.field(default_factory=dict)

    def of(self, topic: str) -> S:
        return self.topics.get(topic, self.default)


def per_topic(cls: type[S]) -> PerTopic[S]:
    """A field holding ``cls`` per topic (``topic.<name>.<setting>``, or ``<setting>`` for
    every topic without its own value)."""
    return cast(PerTopic[S], dataclasses.field(default_factory=lambda: PerTopic(cls()),
                                               metadata={_PER_TOPIC: cls}))


# -- reading a class's declarations ------------------------------------------------------------------
_SETTINGS_OF: dict[type, tuple[Setting, ...]] = {}


def settings_of(cls: type) -> tuple[Setting, ...]:
    """The settings ``cls`` declares itself, in field order (not those it holds per topic)."""
    found = _SETTINGS_OF.get(cls)
    if found is None:
        found = _SETTINGS_OF[cls] = tuple(dataclasses.replace(f.metadata[_SETTING], attribute=f.name)
                                          for f in _fields(cls) if _SETTING in f.metadata)
    return found


def topic_groups_of(cls: type) -> tuple[tuple[str, type[Settings]], ...]:
    """(field, settings class) of each ``per_topic`` field of ``cls``."""
    return tuple((f.name, f.metadata[_PER_TOPIC]) for f in _fields(cls) if _PER_TOPIC in f.metadata)


def _fields(cls: type) -> Iterator[dataclasses.Field]:
    if not (dataclasses.is_dataclass(cls) and issubclass(cls, Settings)):
        raise TypeError(f"{cls.__name__} is not a settings dataclass")
    for f in dataclasses.fields(cls):
        if _SETTING not in f.metadata and _PER_TOPIC not in f.metadata:
            raise TypeError(f"{cls.__name__}.{f.name} is declared without a setting")
        yield f


def make(cls: type[S], values: Mapping[str, Any], topics: Mapping[str, PerTopic[Any]] | None = None) -> S:
    """An instance of ``cls`` from values by setting name (defaults for the others) and its
    per-topic fields by attribute, checked (``Settings.checked``)."""
    kwargs: dict[str, Any] = {}
    for spec in settings_of(cls):
        if spec.name in values:
            kwargs[spec.attribute] = values[spec.name]
        elif spec.required:
            raise ConfigError(f"{spec.name}: required; {spec.required}")
    kwargs.update(topics or {})
    return cls(**kwargs).checked()

