"""write_private: files the daemon publishes (daemon.json, the admin token) are replaced
atomically with mode 0600, so a concurrent reader never sees an empty or partial file."""

from __future__ import annotations

import json
import stat
import threading
from pathlib import Path

from supervisor.interfaces.daemon.auth import write_private


def test_mode_is_0600_and_no_temp_file_is_left(tmp_path: Path) -> None:
    target = tmp_path / "d" / "daemon.json"
    write_private(target, '{"a": 1}\n')
    write_private(target, '{"a": 2}\n')
    assert json.loads(target.read_text()) == {"a": 2}
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert stat.S_IMODE(target.parent.stat().st_mode) == 0o700
    assert sorted(p.name for p in target.parent.iterdir()) == ["daemon.json"]


def test_a_concurrent_reader_never_sees_an_empty_or_partial_file(tmp_path: Path) -> None:
    target = tmp_path / "daemon.json"
    bodies = [json.dumps({"n": n, "pad": "x" * (n % 7) * 1000}) + "\n" for n in range(2000)]
    write_private(target, bodies[0])
    seen: list[str] = []
    done = threading.Event()

    def reader() -> None:
        while not done.is_set():
            seen.append(target.read_text())

    t = threading.Thread(target=reader)
    t.start()
    try:
        for body in bodies:
            write_private(target, body)
    finally:
        done.set()
        t.join()
    assert seen
    valid = set(bodies)
    bad = [s for s in seen if s not in valid]
    assert not bad, f"{len(bad)} of {len(seen)} reads saw a partial file, e.g. {bad[0][:40]!r}"
