"""deploy/prometheus: Prometheus's configuration and the pipeline's alert rules, checked
by promtool (Debian's `prometheus` package; CI installs it and makes its absence a
failure): both are valid, each alert fires on the series that should fire it and stays
quiet on healthy ones (`promtool test rules`), and every metric a rule reads is one
`pipeline metrics` exports.

The alerts' annotations are checked by `promtool check rules` (their templates parse);
the unit tests run the rules without them, so a reworded description changes no test.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import generate_latest

from pipeline.storage.metrics import registry

PROMETHEUS = Path(__file__).resolve().parent.parent / "deploy" / "prometheus"
JOB = {"job": "listings-pipeline", "instance": "127.0.0.1:9464"}


def promtool(*args: str, cwd: Path = PROMETHEUS, tool: str = "promtool", package: str = "prometheus") -> str:
    """promtool's output (or another ``tool`` of Debian's ``package``: amtool); fails the
    test with it when it fails."""
    found = shutil.which(tool)
    if found is None:
        if os.environ.get("PIPELINE_REQUIRE_PROMTOOL") == "1":
            pytest.fail(f"PIPELINE_REQUIRE_PROMTOOL=1 but no {tool} (apt-get install {package})")
        pytest.skip(f"no {tool} here (apt-get install {package})")
    done = subprocess.run([found, *args], check=False, cwd=cwd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def rules() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load((PROMETHEUS / "alerts.yml").read_text())["groups"]
            for rule in group["rules"]]


def series(name: str, values: str, **labels: str) -> dict[str, str]:
    inner = ", ".join(f'{k}="{v}"' for k, v in {**JOB, **labels}.items())
    return {"series": f"{name}{{{inner}}}", "values": values}


def fires(alert: str, at: str, **labels: str) -> dict[str, Any]:
    severity = next(r["labels"]["severity"] for r in rules() if r["alert"] == alert)
    return {"eval_time": at, "alertname": alert, "exp_alerts": [{"exp_labels": {"severity": severity, **labels}}]}


def quiet(alert: str, at: str) -> dict[str, Any]:
    return {"eval_time": at, "alertname": alert, "exp_alerts": []}


# Each alert: the series that make it fire, when, with which labels; and what it must
# not fire on (other queues, quantiles and statuses; the time before its `for:`).
FIRING = {
    "interval": "1m",
    "input_series": [
        series("up", "0x10"),
        series("pipeline_queue_oldest_age_seconds", "4000x20", queue="sources.due"),
        series("pipeline_queue_oldest_age_seconds", "99999x20", queue="listings.unmatched"),
        series("pipeline_queue_expired_leases", "1x20", queue="listings_raw.unprocessed"),
        series("pipeline_fetch_lateness_seconds", "1000x20", quantile="0.95"),
        series("pipeline_fetch_lateness_seconds", "5000x20", quantile="0.5"),
        series("pipeline_notifications", "0 1x20", status="dead"),
        series("pipeline_notifications", "500x20", status="pending"),
        # 30 of every 100 fetches fail
        series("pipeline_sources_fetch_errors_total", "0+30x40", reason="timeout"),
        series("pipeline_sources_fetched_total", "0+30x40", result="failed"),
        series("pipeline_sources_fetched_total", "0+70x40", result="new_items"),
        # of 10 deliveries a minute, 8 take over 15 minutes
        series("pipeline_notification_delivery_latency_seconds_bucket", "0+1x80", le="60"),
        series("pipeline_notification_delivery_latency_seconds_bucket", "0+2x80", le="900"),
        series("pipeline_notification_delivery_latency_seconds_bucket", "0+10x80", le="3600"),
        series("pipeline_notification_delivery_latency_seconds_bucket", "0+10x80", le="+Inf"),
        series("pipeline_websub_subscriptions", "1x40", health="missed"),
        series("pipeline_websub_subscriptions", "9x40", health="pushed"),
        # the daemon looks every minute (time() is 60 s a minute here), then stops at minute 5
        series("pipeline_worker_last_run_timestamp_seconds", "0+60x5 300x20", worker="sensor:collector"),
        series("pipeline_worker_last_run_timestamp_seconds", "0+60x5 300x20", worker="collector"),
    ],
    "alert_rule_test": [
        quiet("PipelineMetricsDown", "4m"),
        fires("PipelineMetricsDown", "6m", **JOB),
        quiet("PipelineCollectorsBehind", "9m"),
        fires("PipelineCollectorsBehind", "11m", **JOB, queue="sources.due"),
        quiet("PipelineStageNotRunning", "14m"),
        fires("PipelineStageNotRunning", "16m", **JOB, queue="listings_raw.unprocessed"),
        fires("PipelineFetchesLate", "16m", **JOB, quantile="0.95"),
        fires("PipelineDeadNotifications", "2m", **JOB, status="dead"),
        fires("PipelineFetchesFailing", "30m"),
        fires("PipelineDeliveriesSlow", "80m"),
        quiet("PipelinePushMissing", "29m"),
        fires("PipelinePushMissing", "31m"),
        quiet("PipelineSensorsStopped", "9m"),
        fires("PipelineSensorsStopped", "11m", **JOB, worker="sensor:collector"),
    ],
}
HEALTHY = {
    "interval": "1m",
    "input_series": [
        series("up", "1x80"),
        series("pipeline_queue_oldest_age_seconds", "30x80", queue="sources.due"),
        series("pipeline_queue_expired_leases", "0x80", queue="listings_raw.unprocessed"),
        series("pipeline_fetch_lateness_seconds", "20x80", quantile="0.95"),
        series("pipeline_notifications", "0x80", status="dead"),
        series("pipeline_sources_fetch_errors_total", "0+1x80", reason="timeout"),
        series("pipeline_sources_fetched_total", "0+99x80", result="new_items"),
        series("pipeline_notification_delivery_latency_seconds_bucket", "0+10x80", le="60"),
        series("pipeline_notification_delivery_latency_seconds_bucket", "0+10x80", le="+Inf"),
        series("pipeline_websub_subscriptions", "0x80", health="missed"),
        series("pipeline_websub_subscriptions", "9x80", health="pushed"),
        series("pipeline_worker_last_run_timestamp_seconds", "0+60x80", worker="sensor:collector"),
    ],
    "alert_rule_test": [quiet(alert, "80m") for alert in (r["alert"] for r in rules())],
}


def test_the_prometheus_config_and_the_alert_rules_are_valid():
    """Processes: promtool."""
    assert "SUCCESS" in promtool("check", "config", "prometheus.yml")
    assert "SUCCESS: 9 rules found" in promtool("check", "rules", "alerts.yml")


def test_the_alertmanager_config_is_valid_and_routes_every_alert_to_the_operator_s_channel():
    """Processes: amtool (Debian's prometheus-alertmanager, as promtool). Prometheus sends
    what fires to the Compose file's Alertmanager, which sends it to `pipeline serve`'s
    /alertmanager with the secrets folder's token: the alerts reach a person (they fired
    into the void before)."""
    from pipeline.core import secret_files
    from pipeline.notify.operator import ALERTS_PER_MESSAGE
    from pipeline.web.app import ALERTMANAGER_PATH

    folder = PROMETHEUS.parent / "alertmanager"
    assert "SUCCESS" in promtool("check-config", "alertmanager.yml", cwd=folder, tool="amtool",
                                 package="prometheus-alertmanager")
    config = yaml.safe_load((folder / "alertmanager.yml").read_text())
    assert config["route"]["receiver"] == "operator" and "routes" not in config["route"]
    [receiver] = config["receivers"]
    [hook] = receiver["webhook_configs"]
    assert hook["url"] == f"http://127.0.0.1:8790{ALERTMANAGER_PATH}" and hook["send_resolved"]
    assert hook["max_alerts"] == ALERTS_PER_MESSAGE
    assert hook["http_config"]["authorization"]["credentials_file"] == (
        f"{secret_files.MOUNT}/PIPELINE_ALERTMANAGER_TOKEN")
    assert "PIPELINE_ALERTMANAGER_TOKEN" in secret_files.SECRETS
    sent_to = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())["alerting"]["alertmanagers"]
    assert sent_to == [{"static_configs": [{"targets": ["127.0.0.1:9093"]}]}]


def test_each_alert_fires_when_it_should_and_not_otherwise(tmp_path):
    """Processes: promtool, on the rules without their annotations."""
    bare = {"groups": [{**group, "rules": [{k: v for k, v in rule.items() if k != "annotations"}
                                            for rule in group["rules"]]}
                       for group in yaml.safe_load((PROMETHEUS / "alerts.yml").read_text())["groups"]]}
    (tmp_path / "alerts.yml").write_text(yaml.safe_dump(bare))
    (tmp_path / "test.yml").write_text(yaml.safe_dump(
        {"rule_files": ["alerts.yml"], "evaluation_interval": "1m", "tests": [FIRING, HEALTHY]}))
    promtool("test", "rules", "test.yml", cwd=tmp_path)
    tested = {t["alertname"] for t in FIRING["alert_rule_test"] if t["exp_alerts"]}
    assert tested == {r["alert"] for r in rules()}, "every alert has a case that fires it"


def test_every_metric_a_rule_reads_is_one_the_pipeline_exports(engine):
    exported = set()
    for line in generate_latest(registry(engine)).decode().splitlines():
        if found := re.fullmatch(r"# TYPE (\S+) (\S+)", line):
            name, kind = found.groups()
            samples = {"counter": {name.removesuffix("_total") + "_total"},
                       "histogram": {f"{name}_bucket", f"{name}_sum", f"{name}_count"}}
            exported |= samples.get(kind, {name})
    read = {name for rule in rules() for name in re.findall(r"\bpipeline_[a-z_]+", rule["expr"])}
    assert read and read <= exported, read - exported
