"""``docs/grafana-dashboard.json``: valid Grafana JSON on a Prometheus datasource variable,
using every metric ``/metrics`` serves and no name it does not."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from supervisor.interfaces.daemon.metrics import METRIC_NAMES

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana-dashboard.json"
#: The sample names a family shows up as (a histogram as buckets, count and sum).
SUFFIXES = ("", "_bucket", "_count", "_sum")


def load() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def targets(dash: dict[str, Any]) -> list[dict[str, Any]]:
    return [t for p in dash["panels"] for t in p.get("targets", [])]


def test_a_prometheus_datasource_variable_drives_every_query() -> None:
    dash = load()
    assert dash["uid"] and dash["title"] and isinstance(dash["schemaVersion"], int)
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ds = {"type": "prometheus", "uid": "${datasource}"}
    assert variables["instance"]["datasource"] == ds
    for panel in dash["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"] == ds, panel["title"]
            assert panel["targets"], panel["title"]
    for target in targets(dash):
        assert target["datasource"] == ds
        assert target["expr"].strip()


def test_panels_have_unique_ids_and_fit_the_grid() -> None:
    panels = load()["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    for p in panels:
        grid = p["gridPos"]
        assert grid["x"] + grid["w"] <= 24, p["title"]
        assert grid["w"] > 0 and grid["h"] > 0


def test_every_metric_is_shown_and_every_name_exists() -> None:
    exprs = " ".join(t["expr"] for t in targets(load()))
    used = set(re.findall(r"\bsandvisor_[a-z_]+", exprs))
    served = {name + suffix for name in METRIC_NAMES for suffix in SUFFIXES}
    assert used <= served, used - served
    for name in METRIC_NAMES:
        assert used & {name + suffix for suffix in SUFFIXES}, f"{name} is on no panel"
