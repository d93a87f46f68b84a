"""Orphan sweep: containers of owners that are gone are reaped; others are never touched."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import docker
import pytest

from supervisor import Supervisor
from supervisor.runtime.ownership import boot_id
from tests.conftest import owned_label, require_engine

pytestmark = pytest.mark.timeout(120)


def make(client: docker.APIClient, labels: dict[str, str]) -> str:
    cid = client.create_container(
        "sandvisor/minimal:latest", ["sleep", "300"], labels={**labels, **owned_label()}
    )["Id"]
    client.start(cid)
    return str(cid)


def owner(lock: Path | str, owner_id: str) -> dict[str, str]:
    return {
        "io.sandvisor.owner": owner_id,
        "io.sandvisor.owner.host": socket.gethostname(),
        "io.sandvisor.owner.boot": boot_id(),
        "io.sandvisor.owner.pid": "999999",
        "io.sandvisor.owner.lock": str(lock),
    }


def exists(client: docker.APIClient, cid: str) -> bool:
    return bool(client.containers(all=True, filters={"id": cid}))


async def test_sweep_reaps_only_gone_owners(tmp_path: Path, policies_dir: Path) -> None:
    require_engine()
    client = docker.APIClient(version="auto")
    stale_lock = tmp_path / "stale" / "supervisor.lock"
    stale_lock.parent.mkdir()
    stale_lock.write_text("")
    old = time.time() - 3600
    os.utime(stale_lock, (old, old))
    fresh_lock = tmp_path / "fresh" / "supervisor.lock"
    fresh_lock.parent.mkdir()
    fresh_lock.write_text("")
    async with Supervisor(state_dir=tmp_path / "live", policies_dir=policies_dir) as live:
        live_lock = tmp_path / "live" / "supervisor.lock"
        ids = {
            "gone": make(client, owner("/nonexistent/state/supervisor.lock", "gone0000")),
            "stale": make(client, owner(stale_lock, "stale000")),
            "restarting": make(client, owner(fresh_lock, "fresh000")),
            "live": make(client, owner(live_lock, live.instance_id + "x")),
            "unlabeled": make(client, {}),
        }
        try:
            async with Supervisor(
                state_dir=tmp_path / "sweeper", policies_dir=policies_dir
            ) as sweeper:
                assert sweeper.instance_id != live.instance_id
                assert not exists(client, ids["gone"])
                assert not exists(client, ids["stale"])
                assert exists(client, ids["restarting"])  # may come back to re-adopt
                assert exists(client, ids["live"])
                assert exists(client, ids["unlabeled"])
        finally:
            for cid in ids.values():
                if exists(client, cid):
                    client.remove_container(cid, force=True)
