"""deploy/: the Kubernetes manifests, the Prometheus alerting rules and the Grafana dashboard.

The manifests are read as YAML and checked for what makes them work with this proxy: each
proxy container's properties (the ConfigMap it mounts, with its KEYRANGE_* variables)
load as the proxy would load them, its probes are /livez and /readyz on the metrics port
the settings name, it runs as the image's user, and the Services and the sidecars'
addresses agree with the pods. The rules pass ``promtool check rules`` and their unit
tests (``promtool test rules``), and every metric the rules and the dashboard name is one
a running proxy exports, with every feature on. (No Kubernetes schema validation:
kubeconform's schemas are not to be had offline.)
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from harness.kafka_cluster import KafkaCluster
from proxy.server.config import ProxyConfig, load_config
from proxy.server.environment import environment_overrides

from .conftest import ProxyFactory

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
RULES = DEPLOY / "prometheus/keyrange-proxy-rules.yml"
DASHBOARD = DEPLOY / "grafana/keyrange-proxy.json"
SIDECARS = DEPLOY / "kubernetes/kafka-with-sidecars.yaml"
PORT_PER_BROKER = DEPLOY / "kubernetes/port-per-broker-proxy.yaml"
IMAGE_USER = 10001  # the Containerfile's USER
PROXY_CONTAINER = "keyrange-proxy"

# -- PromQL: the metric names an expression reads --------------------------------------------------
_FUNCTIONS = {
    "abs", "absent", "absent_over_time", "avg_over_time", "ceil", "changes", "clamp", "clamp_max", "clamp_min",
    "count_over_time", "day_of_month", "day_of_week", "delta", "deriv", "exp", "floor", "histogram_quantile",
    "holt_winters", "hour", "idelta", "increase", "irate", "label_join", "label_replace", "last_over_time", "ln",
    "log10", "log2", "max_over_time", "min_over_time", "minute", "month", "predict_linear", "present_over_time",
    "quantile_over_time", "rate", "resets", "round", "scalar", "sgn", "sort", "sort_desc", "sqrt",
    "stddev_over_time", "stdvar_over_time", "sum_over_time", "time", "timestamp", "vector", "year",
    "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk", "topk", "quantile",
    "label_values",  # Grafana's, in template variables
}
_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
             "offset", "inf", "nan"}
PROMETHEUS_OWN = {"up"}  # written by Prometheus for every scrape


def metric_names(expr: str) -> set[str]:
    """The metric names ``expr`` reads: identifiers once strings, label matchers, grouping
    clauses, durations, Grafana's variables and numbers are taken out, less functions and
    keywords."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', " ", expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\$\w+", " ", text)
    words = set(re.findall(r"(?<![\w.])[A-Za-z_:][\w:]*", text))
    return {word for word in words if word not in _FUNCTIONS and word.lower() not in _KEYWORDS}


def test_metric_names_are_read_from_expressions():
    assert metric_names('histogram_quantile(0.99, sum by (instance, le) (rate(a_seconds_bucket{x="by"}[5m]))) > 1') \
        == {"a_seconds_bucket"}
    assert metric_names('b_total / clamp_min(c{i=~"$instance"} + d offset 5m, 1e-9) and on (g) up == 0') \
        == {"b_total", "c", "d", "up"}
    assert metric_names("label_values(kafka_proxy_ready, instance)") == {"kafka_proxy_ready", "instance"}


# -- what the proxy exports ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def exported(kafka: KafkaCluster, proxy_factory: ProxyFactory) -> set[str]:
    """Every series name a proxy with every feature on exports (families whose series
    appear only once used are named by their HELP and TYPE lines)."""
    proxy = proxy_factory(kafka, metrics_port="0", fetch_prediction_enabled="true",
                          cooperative_fetch_enabled="true", individual_commit_enabled="true")
    try:
        assert proxy.metrics_url is not None
        with urllib.request.urlopen(proxy.metrics_url, timeout=10) as answer:
            text = answer.read().decode()
    finally:
        proxy.stop()
    names: set[str] = set()
    suffixes = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created"),
                "summary": ("", "_sum", "_count", "_created"), "gauge": ("",), "untyped": ("",), "info": ("_info",)}
    for family in text_string_to_metric_families(text):
        names.update(family.name + suffix for suffix in suffixes.get(family.type, ("",)))
        names.update(sample.name for sample in family.samples)
    assert "kafka_proxy_requests_total" in names and "process_resident_memory_bytes" in names
    return names


def _rules() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def _dashboard_expressions() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    exprs += [variable["definition"] for variable in dashboard["templating"]["list"] if "definition" in variable]
    return exprs


def test_every_metric_the_rules_and_the_dashboard_read_is_exported(exported: set[str]):
    read = {(str(path.relative_to(DEPLOY)), name)
            for path, exprs in ((RULES, [rule["expr"] for rule in _rules()]), (DASHBOARD, _dashboard_expressions()))
            for expr in exprs for name in metric_names(expr)}
    unknown = sorted((where, name) for where, name in read
                     if name not in exported and name not in PROMETHEUS_OWN and name != "instance")
    assert not unknown, f"metrics the proxy does not export: {unknown}"
    assert len({name for _, name in read}) > 40  # the dashboard covers every feature


# -- the alerting rules ------------------------------------------------------------------------------
def _promtool(*args: str) -> str:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is missing (Debian package prometheus; scripts/install-system-deps installs it)",
                    pytrace=False)
    done = subprocess.run([promtool, *args], cwd=RULES.parent, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"promtool {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_the_rules_pass_promtool_and_fire_in_their_unit_tests():
    assert "SUCCESS: 18 rules found" in _promtool("check", "rules", RULES.name)
    assert "SUCCESS" in _promtool("test", "rules", "keyrange-proxy-rules.test.yml")


def test_every_rule_is_an_alert_that_says_how_bad_and_what_to_do():
    rules = _rules()
    names = [rule["alert"] for rule in rules]
    assert len(names) == len(set(names)) and all(name.startswith("KeyrangeProxy") for name in names)
    for rule in rules:
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), rule["alert"]
        assert rule["annotations"]["summary"] and len(rule["annotations"]["description"]) > 60, rule["alert"]
    tested = set(re.findall(r"alertname: (\w+)", (RULES.parent / "keyrange-proxy-rules.test.yml").read_text()))
    assert tested >= {"KeyrangeProxyDown", "KeyrangeProxyNotReady", "KeyrangeProxyFramesRefused",
                      "KeyrangeProxyKeyRangeCacheEvictions", "KeyrangeProxyCommitLogSlowWrites"}
    assert tested <= set(names)


# -- the dashboard -------------------------------------------------------------------------------------
def test_the_dashboard_is_one_grafana_dashboard_on_a_chosen_prometheus():
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "keyrange-proxy"
    variables = {variable["name"]: variable for variable in dashboard["templating"]["list"]}
    assert variables["datasource"]["query"] == "prometheus"
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        position = panel["gridPos"]
        assert 0 <= position["x"] and position["x"] + position["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert 'instance=~"$instance"' in target["expr"], (panel["title"], target["expr"])


# -- the Kubernetes manifests ----------------------------------------------------------------------
def _documents(path: Path) -> dict[tuple[str, str], dict[str, Any]]:
    found = {}
    for document in yaml.safe_load_all(path.read_text()):
        assert document["apiVersion"] and document["metadata"]["namespace"] == "kafka", path
        found[(document["kind"], document["metadata"]["name"])] = document
    return found


def _by_kind(documents: dict[tuple[str, str], dict[str, Any]], kind: str) -> Iterator[dict[str, Any]]:
    return (document for (each, _), document in documents.items() if each == kind)


def _container(pod: dict[str, Any], name: str) -> dict[str, Any]:
    return next(container for container in pod["spec"]["containers"] if container["name"] == name)


def _port(container: dict[str, Any], port: int | str) -> int:
    """A container port given by number or by name."""
    if isinstance(port, int):
        return port
    return next(each["containerPort"] for each in container["ports"] if each["name"] == port)


def _proxy_config(documents: dict, pod: dict[str, Any], pod_name: str, tmp_path: Path) -> ProxyConfig:
    """The settings the proxy container of ``pod`` starts with, as named ``pod_name``: the
    properties file its argument names, from the ConfigMap mounted there, with the
    container's KEYRANGE_* variables (``$(VAR)`` expanded as Kubernetes does)."""
    container = _container(pod, PROXY_CONTAINER)
    (path,) = container["args"]
    mount = next(m for m in container["volumeMounts"] if path.startswith(m["mountPath"].rstrip("/") + "/"))
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == mount["name"])
    config_map = documents[("ConfigMap", volume["configMap"]["name"])]
    properties = tmp_path / f"{pod_name}.properties"
    properties.write_text(config_map["data"][path[len(mount["mountPath"].rstrip("/")) + 1:]])
    env: dict[str, str] = {}
    for variable in container.get("env", []):
        if "valueFrom" in variable:
            assert variable["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
            env[variable["name"]] = pod_name
        else:
            env[variable["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], variable["value"])
    return load_config(str(properties), environment_overrides(env))


def _check_proxy_container(pod: dict[str, Any], config: ProxyConfig) -> None:
    """Probes on the metrics port, the client port declared, the image's user, a drain
    that fits in the grace period, scraping where the metrics are."""
    container = _container(pod, PROXY_CONTAINER)
    metrics_port = config.operations.metrics_port
    assert _port(container, "metrics") == metrics_port == 9404
    assert _port(container, "kafka-proxy") == config.cluster.listen_port
    assert config.cluster.listen_host == "0.0.0.0"  # a pod's loopback is its own
    for probe, path in (("livenessProbe", "/livez"), ("readinessProbe", "/readyz")):
        check = container[probe]["httpGet"]
        assert check["path"] == path and _port(container, check["port"]) == metrics_port, probe
    security = container["securityContext"]
    assert security["runAsNonRoot"] is True and security["runAsUser"] == IMAGE_USER
    assert security["allowPrivilegeEscalation"] is False and security["capabilities"]["drop"] == ["ALL"]
    if security.get("readOnlyRootFilesystem"):
        assert any(mount["mountPath"] == "/tmp" for mount in container["volumeMounts"])
    assert pod["spec"]["terminationGracePeriodSeconds"] > config.operations.shutdown_drain_timeout_ms / 1000
    annotations = pod["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert int(annotations["prometheus.io/port"]) == metrics_port and annotations["prometheus.io/path"] == "/metrics"


def _check_service(service: dict[str, Any], pod: dict[str, Any]) -> set[int]:
    """The Service selects the pod and its target ports are the pod's; its ports."""
    labels = pod["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    names = {port["name"]: port["containerPort"] for container in pod["spec"]["containers"]
             for port in container["ports"]}
    for port in service["spec"]["ports"]:
        target = port.get("targetPort", port["port"])
        assert (names[target] if isinstance(target, str) else target) == port["port"], port
    return {port["port"] for port in service["spec"]["ports"]}


def test_the_statefulset_runs_a_sidecar_beside_each_broker(tmp_path):
    documents = _documents(SIDECARS)
    (statefulset,) = _by_kind(documents, "StatefulSet")
    pod = statefulset["spec"]["template"]
    assert {container["name"] for container in pod["spec"]["containers"]} == {"kafka", PROXY_CONTAINER}
    replicas, service_name = statefulset["spec"]["replicas"], statefulset["spec"]["serviceName"]
    headless = documents[("Service", service_name)]
    assert headless["spec"]["clusterIP"] == "None" and headless["spec"]["publishNotReadyAddresses"] is True
    _check_service(headless, pod)
    _check_service(documents[("Service", "keyrange-proxy-sidecars")], pod)

    def dns(ordinal: int) -> str:
        return f"{statefulset['metadata']['name']}-{ordinal}.{service_name}.kafka.svc.cluster.local"

    broker_port = _port(_container(pod, "kafka"), "kafka")
    for ordinal in range(replicas):
        config = _proxy_config(documents, pod, f"kafka-{ordinal}", tmp_path)
        _check_proxy_container(pod, config)
        cluster = config.cluster
        assert cluster.topology == "sidecar"
        assert cluster.bootstrap_servers == [("127.0.0.1", broker_port)]  # its own broker, in the pod
        assert cluster.advertised_host == dns(ordinal)  # from KEYRANGE_ADVERTISED_HOST
        # every node (id = ordinal) reached at its pod's sidecar
        assert cluster.sidecar_node_addresses == {n: (dns(n), cluster.listen_port) for n in range(replicas)}
    # the brokers' node ids are the ordinals the sidecars' addresses name
    kafka = _container(pod, "kafka")
    assert "KAFKA_NODE_ID=${HOSTNAME##*-}" in " ".join(kafka["command"])
    voters = next(v["value"] for v in kafka["env"] if v["name"] == "KAFKA_CONTROLLER_QUORUM_VOTERS")
    assert voters == ",".join(f"{n}@{dns(n)}:{_port(kafka, 'controller')}" for n in range(replicas))


def test_the_port_per_broker_deployment_serves_every_node_behind_its_service(tmp_path):
    documents = _documents(PORT_PER_BROKER)
    (deployment,) = _by_kind(documents, "Deployment")
    pod = deployment["spec"]["template"]
    assert [container["name"] for container in pod["spec"]["containers"]] == [PROXY_CONTAINER]
    config = _proxy_config(documents, pod, "keyrange-proxy-0", tmp_path)
    _check_proxy_container(pod, config)
    cluster = config.cluster
    assert cluster.topology == "port-per-broker"
    service = documents[("Service", "keyrange-proxy")]
    assert cluster.advertised_host == "keyrange-proxy.kafka.svc.cluster.local"  # the Service's name
    # the brokers of kafka-with-sidecars.yaml: the bootstrap port and one port per node id
    (statefulset,) = _by_kind(_documents(SIDECARS), "StatefulSet")
    nodes = range(statefulset["spec"]["replicas"])
    assert cluster.bootstrap_servers == [(f"kafka-{n}.kafka-headless.kafka.svc.cluster.local", 9092) for n in nodes]
    assert _check_service(service, pod) == {cluster.listen_port, *(cluster.node_port_base + n for n in nodes)}
    assert documents[("PodDisruptionBudget", "keyrange-proxy")]["spec"]["minAvailable"] < deployment["spec"]["replicas"]


@pytest.mark.parametrize("name", ["sidecar.properties", "port-per-broker.properties"])
def test_the_example_properties_load(name):
    assert load_config(str(DEPLOY / name), []).cluster.topology == name.removesuffix(".properties")
