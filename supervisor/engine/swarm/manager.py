"""The Swarm manager's API (services, tasks, nodes, networks) as JSON over raw asyncio HTTP:
no thread per call, so a hundred starts at once cost a hundred small requests, not a pool."""

from __future__ import annotations

import asyncio
import json
import urllib.parse
from typing import Any

from supervisor.core.errors import EngineError, EngineUnavailable
from supervisor.engine.docker import http
from supervisor.engine.endpoint import Endpoint
from supervisor.engine.swarm.spec import API_VERSION

#: A manager call that takes longer than this is treated as the manager not answering.
CALL_TIMEOUT_S = 30.0


class NotFoundError(EngineError):
    """The manager answered 404 (a service, node or network that is not there)."""

    code = "swarm_not_found"


def filters(**values: list[str]) -> str:
    """A ``filters`` query parameter (the engine's JSON map of lists)."""
    return urllib.parse.quote(json.dumps(values, separators=(",", ":")))


class ManagerAPI:
    """One Swarm manager."""

    def __init__(self, url: str | None, *, tls_dir: str | None = None) -> None:
        self.endpoint = Endpoint(url, tls_dir=tls_dir)
        self.prefix = f"/v{API_VERSION}"

    @property
    def url(self) -> str:
        return self.endpoint.url

    async def call(
        self, method: str, path: str, body: Any = None, *, timeout: float = CALL_TIMEOUT_S
    ) -> Any:
        """One request; the decoded JSON answer (None when empty). NotFoundError on 404,
        EngineError on another error status, EngineUnavailable when it does not answer."""
        data = None if body is None else json.dumps(body).encode()
        try:
            status, raw = await http.exchange(
                self.endpoint, self.prefix, method, path, timeout=timeout, body=data
            )
        except TimeoutError as exc:
            where = path.split("?", maxsplit=1)[0]
            raise EngineUnavailable(
                f"the Swarm manager at {self.url} did not answer {method} {where} "
                f"within {timeout:g} s"
            ) from exc
        except (OSError, asyncio.IncompleteReadError) as exc:
            raise EngineUnavailable(f"the Swarm manager at {self.url}: {exc}") from exc
        if status == 404:
            raise NotFoundError(f"{method} {path.split('?', maxsplit=1)[0]}: {_message(raw)}")
        if status >= 400:
            raise EngineError(
                f"Swarm manager: {method} {path.split('?', maxsplit=1)[0]}: {_message(raw)}"
            )
        if not raw.strip():
            return None
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise EngineError(f"Swarm manager: {method} {path}: not JSON: {raw[:200]!r}") from exc

    async def ping(self) -> bool:
        try:
            status, body = await http.exchange(
                self.endpoint, self.prefix, "GET", "/_ping", timeout=2.0
            )
        except (EngineUnavailable, TimeoutError, OSError):
            return False
        return status == 200 and body.strip() == b"OK"

    async def nodes(self) -> list[dict[str, Any]]:
        return list(await self.call("GET", "/nodes") or [])

    async def services(self, label: str) -> list[dict[str, Any]]:
        return list(await self.call("GET", f"/services?filters={filters(label=[label])}") or [])

    async def tasks(self, service_ids: list[str]) -> list[dict[str, Any]]:
        query = filters(service=service_ids)
        return list(await self.call("GET", f"/tasks?filters={query}") or [])

    async def create_service(self, spec: dict[str, Any]) -> str:
        answer = await self.call("POST", "/services/create", spec)
        return str(answer["ID"])

    async def remove_service(self, service_id: str) -> bool:
        """Delete a service; False when it was already gone."""
        try:
            await self.call("DELETE", f"/services/{service_id}")
        except NotFoundError:
            return False
        return True

    async def network(self, name: str) -> dict[str, Any] | None:
        try:
            answer = await self.call("GET", f"/networks/{urllib.parse.quote(name)}")
        except NotFoundError:
            return None
        return dict(answer)

    async def create_network(self, body: dict[str, Any]) -> None:
        await self.call("POST", "/networks/create", body)


def _message(raw: bytes) -> str:
    try:
        return str(json.loads(raw).get("message") or raw[:300].decode(errors="replace"))
    except (ValueError, AttributeError):
        return raw[:300].decode(errors="replace")
