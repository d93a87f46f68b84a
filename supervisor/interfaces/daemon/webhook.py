"""Webhook sink: POST each event as JSON, in seq order, HMAC-signed, retried with backoff."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import time

import httpx

from supervisor.core.events import BaseEvent
from supervisor.core.logs import get_logger

log = get_logger("supervisor.webhook")

SIGNATURE_HEADER = "X-Sandvisor-Signature"
TIMESTAMP_HEADER = "X-Sandvisor-Timestamp"


def sign(secret: bytes, timestamp: str, body: bytes) -> str:
    """``sha256=<hex>`` over ``timestamp + "." + body`` (the timestamp defeats replays)."""
    mac = hmac.new(secret, timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    return f"sha256={mac}"


class WebhookSink:
    """Delivers one event at a time; a failing endpoint is retried with exponential backoff
    (capped), so order holds. A dead endpoint only delays this sink: its SinkRunner skips
    ahead with an ``events.gap`` once it falls too far behind, and session end gives up after
    the sink close timeout."""

    def __init__(
        self,
        url: str,
        secret: bytes = b"",
        *,
        timeout_s: float = 10.0,
        max_backoff_s: float = 30.0,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self.url = url
        self.secret = secret
        self.max_backoff_s = max_backoff_s
        self._client = client or httpx.AsyncClient(timeout=timeout_s)
        self._own_client = client is None
        self.attempts = 0

    async def send(self, event: BaseEvent) -> None:
        body = event.model_dump_json().encode()
        delay = 0.5
        while True:
            self.attempts += 1
            stamp = str(int(time.time()))
            headers = {
                "Content-Type": "application/json",
                "X-Sandvisor-Event": event.type,
                "X-Sandvisor-Seq": str(event.seq),
                "X-Sandvisor-Session": event.session_id,
                TIMESTAMP_HEADER: stamp,
            }
            if self.secret:
                headers[SIGNATURE_HEADER] = sign(self.secret, stamp, body)
            try:
                response = await self._client.post(self.url, content=body, headers=headers)
                if response.status_code < 300:
                    return
                if 400 <= response.status_code < 500 and response.status_code not in (408, 429):
                    log.warning(
                        "webhook_rejected",
                        status=response.status_code,
                        seq=event.seq,
                        session_id=event.session_id,
                    )
                    return  # the endpoint will never take it; do not block the rest
                why = f"HTTP {response.status_code}"
            except httpx.HTTPError as exc:
                why = repr(exc)
            log.info("webhook_retry", seq=event.seq, error=why, delay_s=delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.max_backoff_s)

    async def aclose(self) -> None:
        if self._own_client:
            await self._client.aclose()
