"""Settings from the environment: ``KEYRANGE_<SETTING>``, for containers and orchestrators.

A setting's variable is its key in upper case with every ``.`` and ``-`` written ``_``:
``bootstrap.servers`` is ``KEYRANGE_BOOTSTRAP_SERVERS``, ``listen.port`` is
``KEYRANGE_LISTEN_PORT``; a former name has its own variable, read as the setting it now
is. A per-topic setting's variable (``KEYRANGE_KEY_RANGE_FETCH_ENABLED``) is its value for
every topic; one topic's value (``topic.<topic>.<setting>``) has no variable, since topic
names may themselves hold ``.``, ``_`` and ``-``, so the file or ``--override`` says it.

The environment comes between the properties file and ``--override``: a variable wins over
the file, an override over the variable. Every variable under the prefix must be a setting
or one of the few the proxy and its tools read for themselves (``NOT_SETTINGS``), so a
misspelt one stops the proxy at start, named, as an unknown key in the file does; and a
bad value names its variable, which is what whoever set it will look for.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping

from proxy.server.config import SECTIONS
from proxy.settings import ConfigError, Setting, settings_of, topic_groups_of

PREFIX = "KEYRANGE_"

# Variables under the prefix that are not settings, and what reads them.
NOT_SETTINGS: dict[str, str] = {
    "KEYRANGE_PURE_PYTHON": "the accelerators: run every pure-Python reference (proxy/accelerators.py)",
    "KEYRANGE_ACCELERATORS": "the accelerators' build: 'required' fails it when one does not compile (setup.py)",
    "KEYRANGE_CACHE": "where the local Kafka's jars and the tools are cached (proxy/local_kafka.py)",
    "KEYRANGE_KAFKA_DIST": "the Kafka distribution of the local Kafka (proxy/local_kafka.py)",
    "KEYRANGE_MAVEN_SETTINGS": "Maven's settings for fetching the jars (proxy/local_kafka.py)",
    "KEYRANGE_KEEP_WORKDIR": "keep the local Kafka's work directory (proxy/local_kafka.py)",
    "KEYRANGE_CHAOS_SEED": "the chaos matrix's seed (chaos/)",
    "KEYRANGE_FAULT_SEED": "the fault tests' seed (tests/)",
    "KEYRANGE_KILL_SEED": "the kill tests' seed (tests/)",
    "KEYRANGE_FUZZ_SCALE": "the fuzz corpus replay's scale (fuzz/)",
    "KEYRANGE_UPDATE_GOLDEN": "rewrite the golden traffic files (tests/)",
}


def variable_of(key: str) -> str:
    """``bootstrap.servers`` -> ``KEYRANGE_BOOTSTRAP_SERVERS``."""
    return PREFIX + re.sub(r"[.\-]", "_", key).upper()


def _index() -> dict[str, tuple[str, Setting]]:
    """Every setting's variable (former names' too) -> (its key, the setting). Two keys
    with one variable, or a setting's variable among ``NOT_SETTINGS``, is a declaration
    mistake: refused when the module loads, so no test run misses it."""
    specs: list[Setting] = []
    for section in SECTIONS:
        specs += settings_of(section.cls)
        for _, cls in topic_groups_of(section.cls):
            specs += settings_of(cls)
    table: dict[str, tuple[str, Setting]] = {}
    for spec in specs:
        for key in (spec.name, *spec.aliases):
            name = variable_of(key)
            if name in table or name in NOT_SETTINGS:
                taken = table[name][0] if name in table else NOT_SETTINGS[name]
                raise TypeError(f"setting {key}'s variable {name} is taken by {taken}")
            table[name] = (key, spec)
    return table


VARIABLES = _index()


def environment_entries(environ: Mapping[str, str]) -> list[tuple[str, str]]:
    """(key, value) of every setting ``environ`` gives, in the order of their variables'
    names, each value read and checked on its own so a mistake names the variable."""
    entries: list[tuple[str, str]] = []
    given: dict[str, str] = {}  # setting name -> the variable that gave it
    for name in sorted(environ):
        if not name.startswith(PREFIX) or name in NOT_SETTINGS:
            continue
        found = VARIABLES.get(name)
        if found is None:
            raise ConfigError(_unknown(name))
        key, spec = found
        value = environ[name].strip()
        spec.read(value, f"{name} ({key})")
        if spec.name in given:
            raise ConfigError(f"{given[spec.name]} and {name} both set {spec.name} (one is its former name); "
                              f"keep {variable_of(spec.name)}")
        given[spec.name] = name
        entries.append((key, value))
    return entries


def environment_overrides(environ: Mapping[str, str]) -> list[str]:
    """``environment_entries`` as ``key=value`` overrides, to go before ``--override``'s."""
    return [f"{key}={value}" for key, value in environment_entries(environ)]


def _unknown(name: str) -> str:
    if name.startswith(PREFIX + "TOPIC_"):
        return (f"environment variable {name}: one topic's setting (topic.<topic>.<setting>) has no variable, "
                f"topic names being free to hold '.', '_' and '-'; write it in the properties file or as "
                f"--override, or set the value of every topic (e.g. KEYRANGE_KEY_RANGE_FETCH_ENABLED)")
    close = difflib.get_close_matches(name, [*VARIABLES, *NOT_SETTINGS], n=1, cutoff=0.8)
    hint = ""
    if close:
        what = VARIABLES[close[0]][0] if close[0] in VARIABLES else NOT_SETTINGS[close[0]]
        hint = f"; did you mean {close[0]} ({what})?"
    return (f"environment variable {name}: no setting has this variable (a setting's is KEYRANGE_ and its key "
            f"in upper case with '.' and '-' as '_', e.g. KEYRANGE_BOOTSTRAP_SERVERS for bootstrap.servers; "
            f"`keyrange-proxy --help-config` lists the keys){hint}")
