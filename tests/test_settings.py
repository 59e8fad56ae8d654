"""Every setting is read once, in ``Settings``, and a bad value is a clear error naming the
variable, including the Dagster layer's (sensor interval, runs per stage, check
thresholds), which were once read with bare ``int()`` where they were used."""

from __future__ import annotations

import pytest

from pipeline.core.errors import ConfigError
from pipeline.core.settings import Settings


def test_the_dagster_layers_settings_have_their_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("PIPELINE_SENSOR_INTERVAL_SECONDS", "PIPELINE_COLLECTOR_MAX_RUNS",
                 "PIPELINE_STALE_LEASE_MINUTES", "PIPELINE_FRESHNESS_MAX_MINUTES"):
        monkeypatch.delenv(name, raising=False)
    settings = Settings.from_env()
    assert settings.sensor_interval_seconds == 30
    assert [settings.max_runs(s) for s in ("collector", "processor", "notifier")] == [2, 2, 2]
    assert (settings.stale_lease_minutes, settings.freshness_max_minutes) == (10, 60)


def test_the_dagster_layers_settings_are_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIPELINE_SENSOR_INTERVAL_SECONDS", "12")
    monkeypatch.setenv("PIPELINE_PROCESSOR_MAX_RUNS", "5")
    settings = Settings.from_env()
    assert settings.sensor_interval_seconds == 12
    assert settings.max_runs("processor") == 5 and settings.max_runs("collector") == 2


@pytest.mark.parametrize(("name", "value", "message"), [
    ("PIPELINE_SENSOR_INTERVAL_SECONDS", "often", "PIPELINE_SENSOR_INTERVAL_SECONDS='often' is not a whole number"),
    ("PIPELINE_SENSOR_INTERVAL_SECONDS", "2", "PIPELINE_SENSOR_INTERVAL_SECONDS=2 must be at least 5"),
    ("PIPELINE_NOTIFIER_MAX_RUNS", "0", "PIPELINE_NOTIFIER_MAX_RUNS=0 must be at least 1"),
    ("PIPELINE_STALE_LEASE_MINUTES", "ten", "PIPELINE_STALE_LEASE_MINUTES='ten' is not a whole number"),
])
def test_a_bad_value_is_an_error_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str, message: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as raised:
        Settings.from_env()
    assert str(raised.value) == message


def test_the_sensors_read_their_settings_from_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    from sensors.runs import max_runs, sensor_interval

    monkeypatch.setenv("PIPELINE_SENSOR_INTERVAL_SECONDS", "7")
    monkeypatch.setenv("PIPELINE_COLLECTOR_MAX_RUNS", "3")
    assert sensor_interval() == 7 and max_runs("collector") == 3
    monkeypatch.setenv("PIPELINE_COLLECTOR_MAX_RUNS", "-1")
    with pytest.raises(ConfigError, match="PIPELINE_COLLECTOR_MAX_RUNS=-1 must be at least 1"):
        max_runs("collector")
