"""Tests for manifests/components/monitoring: the PodMonitor, the PrometheusRule and the Grafana dashboard.

The alerts are checked by promtool (`promtool check rules`, and the unit tests of
tests/monitoring/rules_test.yaml under `promtool test rules`), every panel's query is parsed by promtool,
and every metric an alert or a panel names is read from the /metrics of a running `gpupool serve`.
Tests that need promtool (Debian's `prometheus` package) or kubectl skip with the reason when it is
missing; `.ci/run` installs promtool where it can.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from tests.conftest import (
    DEMO_INVENTORY,
    REPO,
    ApiServerClient,
    ServerProcess,
    admission_review,
    free_port,
    health_get,
    serve_argv,
    server_env,
    wait_until,
)
from tests.manifests.rendered import admitted, network_policy_sources, parse_objects
from tests.markdown import anchors
from tests.queue.e2e import Cluster
from webhook.testing import KubeSim

COMPONENT = REPO / "manifests" / "components" / "monitoring"
RULES = COMPONENT / "prometheusrule.yaml"
DASHBOARD = COMPONENT / "dashboard.json"
RULE_TESTS = REPO / "tests" / "monitoring" / "rules_test.yaml"
OPERATIONS = REPO / "docs" / "operations.md"
RUNBOOKS = "https://github.com/gpupool/gpupool/blob/main/docs/operations.md"
PROMTOOL = shutil.which("promtool")
KUBECTL = shutil.which("kubectl")
# What Grafana fills in before a query reaches Prometheus, for promtool to parse the query.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__range": "1h", "$__interval": "1m", "$job": "gpupool"}
METRIC = re.compile(r"\bgpupool_[a-z0-9_]+\b")

needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool is not on PATH (Debian and Ubuntu: apt-get install prometheus)"
)
needs_kubectl = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not on PATH: it renders the component")


def rule_groups() -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = yaml.safe_load(RULES.read_text(encoding="utf-8"))["spec"]["groups"]
    return groups


def alerts() -> list[dict[str, Any]]:
    return [rule for group in rule_groups() for rule in group["rules"] if "alert" in rule]


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return loaded


def panel_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) for every query of every panel."""
    return [(p["title"], t["expr"]) for p in dashboard()["panels"] for t in p["targets"]]


def with_grafana_variables(expr: str) -> str:
    for name, value in sorted(GRAFANA_VARIABLES.items(), key=lambda kv: -len(kv[0])):
        expr = expr.replace(name, value)
    assert "$" not in expr, f"a Grafana variable this test does not know in {expr!r}"
    return expr


def promtool(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run(
        [PROMTOOL, *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


def write_rules(directory: Path) -> Path:
    """The PrometheusRule's groups as a Prometheus rule file, which is what promtool reads."""
    path = directory / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule_groups()}, sort_keys=False), encoding="utf-8")
    return path


def test_the_rules_and_panels_are_read_from_the_files() -> None:
    """Guard against checks that pass because they found nothing to check."""
    names = {a["alert"] for a in alerts()}
    assert {"GpupoolNoReadyReplica", "GpupoolAdmissionLatencyHigh", "GpupoolQuotaNearLimit"} <= names
    assert len(panel_queries()) >= 10


# --- the alerts ------------------------------------------------------------------------------------


@needs_promtool
def test_every_rule_passes_promtool_check(tmp_path: Path) -> None:
    done = promtool("check", "rules", write_rules(tmp_path), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {sum(len(g['rules']) for g in rule_groups())} rules found" in done.stdout


@needs_promtool
def test_the_alerts_unit_tests_pass(tmp_path: Path) -> None:
    """tests/monitoring/rules_test.yaml: each alert fires on the series it is for, with its labels and
    annotations, and stays silent on the ones it is not for."""
    write_rules(tmp_path)
    shutil.copy(RULE_TESTS, tmp_path / "rules_test.yaml")
    done = promtool("test", "rules", "rules_test.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_has_a_case_where_it_fires_and_one_where_it_does_not() -> None:
    """A new alert comes with its unit tests: at least one evaluation that expects it and one that
    expects nothing (pending, or not its condition)."""
    tests = yaml.safe_load(RULE_TESTS.read_text(encoding="utf-8"))
    assert tests["rule_files"] == ["rules.yaml"]
    cases = [case for test in tests["tests"] for case in test.get("alert_rule_test", [])]
    for name in (a["alert"] for a in alerts()):
        mine = [c for c in cases if c["alertname"] == name]
        assert any(c["exp_alerts"] for c in mine), f"{name}: no unit test where it fires"
        assert any(not c["exp_alerts"] for c in mine), f"{name}: no unit test where it stays silent"


@pytest.mark.parametrize("alert", alerts(), ids=lambda a: a["alert"])
def test_every_alert_has_a_severity_and_its_runbook(alert: dict[str, Any]) -> None:
    """An on-call engineer gets a severity to route by, a summary, a description, and a runbook_url
    that points at the alert's own section of docs/operations.md."""
    assert alert["labels"]["severity"] in ("critical", "warning", "info")
    assert alert["annotations"]["summary"] and alert["annotations"]["description"]
    url, _, anchor = alert["annotations"]["runbook_url"].partition("#")
    assert url == RUNBOOKS
    assert anchor == alert["alert"].lower() and anchor in anchors(OPERATIONS), f"no runbook section {anchor}"


# --- the dashboard ---------------------------------------------------------------------------------


@needs_promtool
def test_every_panel_query_parses(tmp_path: Path) -> None:
    """Each panel's PromQL (with Grafana's variables filled in) is a valid expression: promtool checks
    it as a recording rule of a throwaway rule file."""
    rules = [
        {"record": f"gpupool:panel_{i}", "expr": with_grafana_variables(e)} for i, (_, e) in enumerate(panel_queries())
    ]
    path = tmp_path / "panels.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "panels", "rules": rules}]}), encoding="utf-8")
    done = promtool("check", "rules", path, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_dashboard_is_grafana_json_with_a_datasource_variable() -> None:
    """Every panel queries the dashboard's Prometheus data source variable (so the sidecar's import works
    on any Grafana) and has a unique id and title."""
    board = dashboard()
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    panels = board["panels"]
    assert len({p["id"] for p in panels}) == len(panels) and len({p["title"] for p in panels}) == len(panels)
    for p in panels:
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        assert all('job=~"$job"' in t["expr"] for t in p["targets"]), p["title"]


# --- every metric named exists on a running server -------------------------------------------------


QUEUED_NAMESPACE = "team-q"


@pytest.fixture(scope="module")
def exposed_metrics(tmp_path_factory: pytest.TempPathFactory, cert_dir: Path) -> Iterator[set[str]]:
    """The sample names on /metrics of `gpupool serve` as installed: a live inventory (the demo cluster,
    served by the API simulator) and a policy with a namespace that queues, so the queue runs and leads.
    Traffic of every kind there is: admissions of every outcome (a placement, a quota denial, an invalid
    Pod), a validating call, and two Pods queued in a namespace allowed one medium GPU, of which the leader
    releases one while the other keeps waiting."""
    work = tmp_path_factory.mktemp("monitoring")
    policy = yaml.safe_load((REPO / "examples" / "policy.yaml").read_text(encoding="utf-8"))
    policy["namespaces"][QUEUED_NAMESPACE] = {"placement": "queue", "classQuota": {"medium": 1}}
    (work / "policy.yaml").write_text(yaml.safe_dump(policy), encoding="utf-8")
    cluster_objects = yaml.safe_load(DEMO_INVENTORY.read_text(encoding="utf-8"))["items"]
    with KubeSim(bookmark_interval=0.2) as sim:
        sim.load(cluster_objects)
        port, health_port = free_port(), free_port()
        argv = serve_argv(cert_dir, port, health_port, "--kubeconfig", str(sim.write_kubeconfig(work / "kubeconfig")),
                          "--policy", str(work / "policy.yaml"))  # fmt: skip
        env = server_env(POD_NAME="gpupool-webhook-0", POD_NAMESPACE="gpupool-system")
        server = ServerProcess(argv, work / "server.log", env, health_port).start()
        client = ApiServerClient(port, cert_dir / "ca.crt")
        try:
            server.wait_ready()
            for name in ("class-medium", "team-a-quota", "bad-annotation"):
                pod = yaml.safe_load((REPO / "examples" / "pods" / f"{name}.yaml").read_text(encoding="utf-8"))
                namespace = pod["metadata"]["namespace"]
                assert client.review(admission_review(pod, namespace=namespace))["response"]["uid"]
            validated = client.post(orjson.dumps(admission_review(pod, namespace=namespace)), path="/validate")
            assert validated.status == 200 and validated.json()["response"]["uid"]
            cluster = Cluster(sim, [server], [client])
            for name in ("first", "second"):
                cluster.create(name, QUEUED_NAMESPACE)
            wait_until(lambda: cluster.released(QUEUED_NAMESPACE, "first"), 40, "the leader's release")
            assert not cluster.released(QUEUED_NAMESPACE, "second")  # the class quota holds it

            def scraped() -> set[str]:
                status, body, _ = health_get(health_port, "/metrics")
                assert status == 200
                lines = body.decode().splitlines()
                return {line.split("{")[0].split(" ")[0] for line in lines if not line.startswith("#")}

            # The queue's gauges are set by the runner's loop at most once a second, the others every 5 s.
            queue = {"gpupool_queue_wait_seconds_count", "gpupool_queue_pods", "gpupool_queue_oldest_wait_seconds"}
            wait_until(lambda: queue <= scraped(), 20, "the queue's metrics")
            yield scraped()
        finally:
            client.close()
            server.stop(timeout=20)


def named_metrics(expr: str) -> set[str]:
    return set(METRIC.findall(expr))


@pytest.mark.slow
def test_every_metric_an_alert_or_a_panel_names_is_exposed(exposed_metrics: set[str]) -> None:
    """A renamed metric cannot leave an alert that never fires or a panel that stays empty."""
    named = {m for a in alerts() for m in named_metrics(a["expr"])}
    named |= {m for _, e in panel_queries() for m in named_metrics(e)}
    named |= {m for v in dashboard()["templating"]["list"] for m in named_metrics(json.dumps(v.get("query", "")))}
    assert {"gpupool_quota_used_bytes", "gpupool_admission_duration_seconds_bucket"} <= named
    queue = {"gpupool_queue_pods", "gpupool_queue_oldest_wait_seconds", "gpupool_queue_wait_seconds_bucket",
             "gpupool_queue_releases_total", "gpupool_queue_leader"}  # fmt: skip
    assert queue | {"gpupool_validations_total", "gpupool_serving_certificate_expiry_seconds"} <= named
    missing = sorted(named - exposed_metrics)
    assert not missing, f"named in the alerts or the dashboard but not on /metrics: {missing}"


# --- the component, rendered -----------------------------------------------------------------------


def render_with_component(tmp_path: Path, extra: str = "") -> Any:
    """The cert-manager overlay with the monitoring component, as a user's kustomization stacks them."""
    assert KUBECTL is not None
    shutil.copytree(REPO / "manifests", tmp_path / "manifests", ignore=shutil.ignore_patterns("*.py"))
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "kustomization.yaml").write_text(
        "resources: [../manifests/overlays/cert-manager]\ncomponents: [../manifests/components/monitoring]\n" + extra,
        encoding="utf-8",
    )
    done = subprocess.run(
        [KUBECTL, "kustomize", str(tmp_path / "mine")], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    return parse_objects(done.stdout, "with monitoring")


@needs_kubectl
def test_the_podmonitor_scrapes_the_health_port_of_every_gpupool_pod(tmp_path: Path) -> None:
    """Selected by kube-prometheus-stack's default (`release` label), in the Pods' namespace, selecting the
    Deployment's Pods by their labels, on the container port that serves /metrics, with honorLabels so the
    quota metrics keep the quota's namespace."""
    rendering = render_with_component(tmp_path)
    monitor = rendering.one("PodMonitor")
    deployment = rendering.one("Deployment")
    assert monitor["metadata"]["namespace"] == deployment["metadata"]["namespace"]
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    ports = {p["name"] for p in rendering.container["ports"]}
    assert endpoint["port"] in ports and endpoint["path"] == "/metrics" and endpoint["honorLabels"] is True
    rule = rendering.one("PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert rule["spec"]["groups"] == rule_groups()


@needs_kubectl
def test_prometheus_in_the_monitoring_namespace_may_reach_the_scraped_port(tmp_path: Path) -> None:
    """The port the PodMonitor scrapes is the one the NetworkPolicy opens to the metrics namespaces
    (`monitoring` unless METRICS_NAMESPACES says otherwise), and to nothing else: a Prometheus elsewhere
    scrapes nothing, which the monitoring docs say, with the variable that changes it."""
    rendering = render_with_component(tmp_path)
    (endpoint,) = rendering.one("PodMonitor")["spec"]["podMetricsEndpoints"]
    (port,) = [p["containerPort"] for p in rendering.container["ports"] if p["name"] == endpoint["port"]]
    assert network_policy_sources(rendering)[port] == ["ns:monitoring"]
    assert admitted(rendering, port, namespace="monitoring")
    assert not admitted(rendering, port, namespace="prometheus")
    monitoring = OPERATIONS.read_text(encoding="utf-8").split("## Monitoring", 1)[1].split("\n## ", 1)[0]
    assert "`METRICS_NAMESPACES`" in monitoring and "`monitoring`" in monitoring


@needs_kubectl
def test_the_dashboard_configmap_is_found_by_grafanas_sidecar(tmp_path: Path) -> None:
    """kube-prometheus-stack's Grafana sidecar loads ConfigMaps labelled grafana_dashboard: "1" from every
    namespace; the ConfigMap holds the dashboard JSON as it is in the repository."""
    (configmap,) = [
        c for c in render_with_component(tmp_path).all("ConfigMap") if c["metadata"]["name"] == "gpupool-dashboard"
    ]
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(configmap["data"]["gpupool.json"]) == dashboard()


@needs_kubectl
def test_the_release_label_is_replaced_by_the_documented_patch(tmp_path: Path) -> None:
    """The patch in the component's kustomization.yaml (and docs/operations.md) for another Helm release
    name relabels the PodMonitor and the PrometheusRule."""
    patch = (
        "patches:\n  - target: {group: monitoring.coreos.com}\n    patch: |-\n"
        "      - {op: replace, path: /metadata/labels/release, value: my-release}\n"
    )
    assert patch.splitlines()[-1].strip() in (COMPONENT / "kustomization.yaml").read_text(encoding="utf-8")
    rendering = render_with_component(tmp_path, patch)
    for kind in ("PodMonitor", "PrometheusRule"):
        assert rendering.one(kind)["metadata"]["labels"]["release"] == "my-release"


@needs_kubectl
def test_the_documented_patch_sets_the_queue_wait_threshold(tmp_path: Path) -> None:
    """The kustomize patch docs/operations.md gives for GpupoolQueueWaitLong's threshold renders the rule
    with the new threshold and every other rule as shipped; its `test` op names the alert it changes."""
    alerts_section = OPERATIONS.read_text(encoding="utf-8").split("\n## Alerts\n", 1)[1].split("\n### ", 1)[0]
    blocks = [b for b in re.findall(r"```yaml\n(.*?)```", alerts_section, re.S) if "GpupoolQueueWaitLong" in b]
    assert len(blocks) == 1, "one documented patch for the threshold"
    rule = render_with_component(tmp_path, blocks[0]).one("PrometheusRule")
    rendered = [r for g in rule["spec"]["groups"] for r in g["rules"]]
    shipped = [r for g in rule_groups() for r in g["rules"]]
    changed = [(a, b) for a, b in zip(shipped, rendered, strict=True) if a != b]
    assert [(a["alert"], b["expr"]) for a, b in changed] == [
        ("GpupoolQueueWaitLong", "max by (namespace) (gpupool_queue_oldest_wait_seconds) > 8 * 3600")
    ]
