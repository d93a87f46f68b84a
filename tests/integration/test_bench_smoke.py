"""`python -m bench.run --quick start throughput` runs end to end and writes its results."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import docker
import pytest

from tests.conftest import REPO

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]

ROW_KEYS = {"metric", "unit", "ours", "baseline", "base", "ratio", "target", "passed"}


def test_quick_bench_writes_results(tmp_path: Path) -> None:
    # No skip when the engine is missing: the run fails, and so does this test.
    out = tmp_path / "results"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bench.run",
            "--quick",
            "--out",
            str(out),
            "start",
            "throughput",
            "http-start",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        stdout, stderr = proc.communicate(timeout=160)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stdout[-3000:] + stderr[-3000:]
    for name in ("start", "throughput", "http-start"):
        files = sorted(out.glob(f"{name}-*.json"))
        assert len(files) == 1, sorted(p.name for p in out.iterdir())
        data = json.loads(files[0].read_text())
        assert data["name"] == name
        assert data["quick"] is True
        assert "bench.run" in data["command"] and "--quick" in data["command"]
        machine = data["machine"]
        for key in ("cpu_model", "cores", "ram_gib", "kernel", "engine"):
            assert machine[key], key
        assert machine["engine"].get("version"), machine["engine"]
        assert data["rows"], data
        for r in data["rows"]:
            assert set(r) >= ROW_KEYS, r
            assert r["ours"]["n"] >= 1
        assert not any(data["errors"].values()), data["errors"]
    start = json.loads(next(out.glob("start-*.json")).read_text())
    metrics = {r["metric"]: r for r in start["rows"]}
    cold = metrics["cold start -> first byte"]
    assert cold["ours"]["n"] == 5 and cold["base"]["n"] == 5 and cold["ratio"] > 0
    assert metrics["warm-pool start -> first byte"]["ours"]["p50"] > 0
    http = json.loads(next(out.glob("http-start-*.json")).read_text())
    assert http["rows"][0]["ours"]["n"] == 5 and http["rows"][0]["base"]["n"] == 5
    tput = json.loads(next(out.glob("throughput-*.json")).read_text())
    assert tput["rows"][0]["ours"]["p50"] > 0 and tput["rows"][0]["base"]["p50"] > 0
    summary = (out / "summary.md").read_text()
    assert "## start" in summary and "## throughput" in summary
    assert "ratio" in stdout
    # Nothing left behind: neither its raw containers nor its supervisor's.
    client = docker.APIClient(version="auto", timeout=10)
    for label in (f"io.sandvisor.test={proc.pid}", f"io.sandvisor.owner.pid={proc.pid}"):
        assert not client.containers(all=True, filters={"label": label}), label


WS_BENCHES = ("workspace", "workspace-start")


def test_quick_workspace_benches(tmp_path: Path) -> None:
    """The workspace benchmarks (change engine, and start with a workspace) run end to end."""
    out = tmp_path / "results"
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.run", "--quick", "--out", str(out), *WS_BENCHES],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        stdout, stderr = proc.communicate(timeout=110)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stdout[-3000:] + stderr[-3000:]
    for name in ("workspace", "workspace-start"):
        data = json.loads(next(out.glob(f"{name}-*.json")).read_text())
        assert data["rows"] and not any(data["errors"].values()), data
        for r in data["rows"]:
            assert set(r) >= ROW_KEYS and r["ours"]["n"] >= 1, r
    start = json.loads(next(out.glob("workspace-start-*.json")).read_text())
    metrics = {r["metric"]: r for r in start["rows"]}
    for phase in ("cold", "warm"):
        assert metrics[f"{phase}: overlay workspace -> first byte"]["ratio"] > 0
        assert metrics[f"{phase}: overlay - none, paired"]["passed"] is not None
    # Nothing left behind: no container, no overlay volume.
    client = docker.APIClient(version="auto", timeout=10)
    label = f"io.sandvisor.owner.pid={proc.pid}"
    assert not client.containers(all=True, filters={"label": label})
    assert not (client.volumes(filters={"label": label}) or {}).get("Volumes")


def test_quick_metrics_scrape_bench(tmp_path: Path) -> None:
    """The daemon's CPU under /metrics scrapes is measured, and the daemon's tasks go."""
    out = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.run", "--quick", "--out", str(out), "metrics-scrape"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        timeout=150,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(next(out.glob("metrics-scrape-*.json")).read_text())
    rows = {r["metric"].split(",")[0]: r for r in data["rows"]}
    cpu = rows["daemon CPU"]
    assert cpu["ours"]["n"] == 1 and cpu["base"]["n"] == 1 and cpu["passed"] is not None
    scrape = rows["one scrape of /metrics (HTTP on the unix socket)"]
    assert scrape["ours"]["n"] >= 3 and scrape["ours"]["p50"] > 0
    assert rows["/metrics body"]["ours"]["p50"] > 1000
    assert rows["quiet tasks running"]["passed"] is True
    assert rows["containers left after end"]["passed"] is True
