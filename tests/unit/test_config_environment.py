"""Settings from KEYRANGE_* environment variables: between the file and --override, every
variable under the prefix a setting or named as not one, mistakes named by their variable."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from proxy.server import cli
from proxy.server.config import ConfigError, every_key, load_config
from proxy.server.environment import (
    NOT_SETTINGS,
    VARIABLES,
    environment_entries,
    environment_overrides,
    variable_of,
)

ROOT = Path(__file__).resolve().parents[2]


def _config(environ: dict[str, str], overrides: list[str] = (), path: str | None = None):
    return load_config(path, [*environment_overrides(environ), *overrides])


def test_a_setting_s_variable_is_its_key_in_upper_case_with_underscores():
    assert variable_of("bootstrap.servers") == "KEYRANGE_BOOTSTRAP_SERVERS"
    assert variable_of("max.inflight.requests.per.connection") == "KEYRANGE_MAX_INFLIGHT_REQUESTS_PER_CONNECTION"
    # every key the proxy reads (per-topic ones alone: the value of every topic) has one
    assert {variable_of(key) for key in every_key(former=True) if not key.startswith("topic.")} == set(VARIABLES)


def test_the_environment_wins_over_the_file_and_an_override_over_the_environment(tmp_path):
    path = tmp_path / "proxy.properties"
    path.write_text("bootstrap.servers=file:9092\nlisten.port=19092\nmax.connections=5\n")
    environ = {"KEYRANGE_LISTEN_PORT": " 29092 ", "KEYRANGE_MAX_CONNECTIONS": "7", "PATH": "/usr/bin"}
    config = _config(environ, ["max.connections=9"], str(path))
    assert config.cluster.bootstrap_servers == [("file", 9092)]
    assert config.cluster.listen_port == 29092
    assert config.limits.max_connections == 9
    # without a file at all, as a container configured only by its environment
    config = _config({"KEYRANGE_BOOTSTRAP_SERVERS": "kafka-0:9092,kafka-1:9092", "KEYRANGE_LISTEN_HOST": "0.0.0.0",
                      "KEYRANGE_LOG_FORMAT": "json", "KEYRANGE_KEY_RANGE_FETCH_ENABLED": "false"})
    assert config.cluster.bootstrap_servers == [("kafka-0", 9092), ("kafka-1", 9092)]
    assert config.cluster.listen_host == "0.0.0.0"
    assert config.operations.log_format == "json"
    assert config.keyrange.topics.of("orders").fetch_enabled is False  # every topic's value


def test_a_former_name_s_variable_is_read_as_the_new_setting_and_wins_over_the_file_s_new_name(tmp_path):
    path = tmp_path / "proxy.properties"
    path.write_text("bootstrap.servers=h:1\nindividual.commit.enabled=true\n")
    config = _config({"KEYRANGE_ACCEPT_INDIVIDUAL_COMMIT": "false"}, path=str(path))
    assert config.individual.enabled is False
    assert config.renamed == (("accept.individual.commit", "individual.commit.enabled"),)


@pytest.mark.parametrize(
    "environ, message",
    [
        ({"KEYRANGE_LISTN_PORT": "1"},
         "environment variable KEYRANGE_LISTN_PORT: no setting has this variable (a setting's is KEYRANGE_ and its "
         "key in upper case with '.' and '-' as '_', e.g. KEYRANGE_BOOTSTRAP_SERVERS for bootstrap.servers; "
         "`keyrange-proxy --help-config` lists the keys); did you mean KEYRANGE_LISTEN_PORT (listen.port)?"),
        ({"KEYRANGE_PURE_PYTON": "1"}, "did you mean KEYRANGE_PURE_PYTHON (the accelerators: run every pure-Python"),
        ({"KEYRANGE_SOMETHING": "1"}, "lists the keys)"),
        ({"KEYRANGE_TOPIC_ORDERS_KEY_RANGE_FETCH_ENABLED": "false"},
         "environment variable KEYRANGE_TOPIC_ORDERS_KEY_RANGE_FETCH_ENABLED: one topic's setting "
         "(topic.<topic>.<setting>) has no variable"),
        ({"KEYRANGE_LISTEN_PORT": "ninety"},
         "KEYRANGE_LISTEN_PORT (listen.port): invalid value 'ninety': invalid literal for int()"),
        ({"KEYRANGE_MAX_CONNECTIONS": "0"}, "KEYRANGE_MAX_CONNECTIONS (max.connections): must be at least 1 (got '0')"),
        ({"KEYRANGE_TOPOLOGY": "mesh"}, "KEYRANGE_TOPOLOGY (topology): must be one of port-per-broker, sidecar"),
        ({"KEYRANGE_INDIVIDUAL_COMMIT_ENABLED": "true", "KEYRANGE_ACCEPT_INDIVIDUAL_COMMIT": "false"},
         "KEYRANGE_ACCEPT_INDIVIDUAL_COMMIT and KEYRANGE_INDIVIDUAL_COMMIT_ENABLED both set individual.commit.enabled "
         "(one is its former name); keep KEYRANGE_INDIVIDUAL_COMMIT_ENABLED"),
    ],
)
def test_mistakes_are_refused_naming_the_variable(environ, message):
    with pytest.raises(ConfigError) as raised:
        environment_entries(environ)
    assert message in str(raised.value), str(raised.value)


def test_variables_that_are_not_settings_and_other_prefixes_are_left_alone():
    environ = {name: "1" for name in NOT_SETTINGS} | {"KEYRANGEX": "1", "keyrange_listen_port": "1", "HOME": "/"}
    assert environment_entries(environ) == []


def test_every_keyrange_variable_the_repository_names_is_a_setting_or_declared_as_not_one():
    """A tool that reads a new KEYRANGE_* variable must add it to NOT_SETTINGS, or every
    proxy started with it set would refuse to start."""
    named: dict[str, str] = {}
    for folder in ("proxy", "harness", "tests", "benchmarks", "chaos", "fuzz", "experiments", "scripts", "docs",
                   "deploy"):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix not in (".py", ".md", ".sh", ".yml", ".yaml", ".properties", "") or not path.is_file():
                continue
            if path == Path(__file__).resolve():  # this file names wrong ones on purpose
                continue
            text = path.read_text(errors="replace")
            for name in re.findall(r"\bKEYRANGE_[A-Z0-9][A-Z0-9_]*[A-Z0-9]\b", text):
                named.setdefault(name, str(path.relative_to(ROOT)))
    for name in re.findall(r"\bKEYRANGE_[A-Z0-9][A-Z0-9_]*[A-Z0-9]\b", (ROOT / "Makefile").read_text()):
        named.setdefault(name, "Makefile")
    unknown = {name: where for name, where in named.items()
               if name not in VARIABLES and name not in NOT_SETTINGS and not name.startswith("KEYRANGE_TOPIC_")}
    assert not unknown, f"KEYRANGE_* variables neither a setting nor in NOT_SETTINGS: {unknown}"


def test_the_command_line_reports_a_bad_variable_and_exits_2(monkeypatch, capsys):
    monkeypatch.setenv("KEYRANGE_BOOTSTRAP_SERVER", "h:1")
    assert cli.main([]) == 2
    assert capsys.readouterr().err == (
        "keyrange-proxy: configuration error: environment variable KEYRANGE_BOOTSTRAP_SERVER: no setting has this "
        "variable (a setting's is KEYRANGE_ and its key in upper case with '.' and '-' as '_', e.g. "
        "KEYRANGE_BOOTSTRAP_SERVERS for bootstrap.servers; `keyrange-proxy --help-config` lists the keys); did you "
        "mean KEYRANGE_BOOTSTRAP_SERVERS (bootstrap.servers)?\n")


def test_version_names_each_accelerator():
    lines = cli.version_text().splitlines()
    assert re.fullmatch(r"keyrange-proxy \S+.*", lines[0])
    assert re.fullmatch(r"python 3\.\d+\.\d+\S*", lines[1])
    assert [line.split(":")[0] for line in lines[2:]] == ["record kernels", "native relay", "range commits"]
    assert all(line.split(": ")[1] in ("C", "pure Python", "off") for line in lines[2:])
