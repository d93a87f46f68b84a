"""Where the engine listens: ``DOCKER_HOST`` parsed once (unix:// or tcp://, optional TLS
from ``DOCKER_TLS_VERIFY``/``DOCKER_CERT_PATH``), and connections to it."""

from __future__ import annotations

import asyncio
import os
import ssl
import urllib.parse
from collections.abc import Callable
from typing import Any, TypeVar

from supervisor.core.errors import EngineUnavailable

DEFAULT_SOCKET = "/var/run/docker.sock"
#: Stream reader buffer for engine connections.
READ_SIZE = 1 << 20

P = TypeVar("P", bound=asyncio.BaseProtocol)


def docker_host() -> str:
    """``$DOCKER_HOST``, or the local engine's socket."""
    return os.environ.get("DOCKER_HOST") or f"unix://{DEFAULT_SOCKET}"


def tls_context(cert_path: str | None) -> ssl.SSLContext:
    """Verify the engine's certificate (against ``ca.pem`` in ``cert_path`` when given)
    and present ``cert.pem``/``key.pem`` from there (mutual TLS, as dockerd's --tlsverify
    expects)."""
    ctx = ssl.create_default_context()
    if cert_path:
        ctx.load_verify_locations(os.path.join(cert_path, "ca.pem"))
        ctx.load_cert_chain(os.path.join(cert_path, "cert.pem"), os.path.join(cert_path, "key.pem"))
    return ctx


class Endpoint:
    """Where the engine listens, parsed from DOCKER_HOST (unix:// or tcp://, optional TLS)."""

    def __init__(self, base_url: str | None, *, tls_dir: str | None = None) -> None:
        url = base_url or docker_host()
        self.url = url
        parsed = urllib.parse.urlparse(url)
        self.unix_path: str | None = None
        self.host = ""
        self.port = 0
        self.ssl: ssl.SSLContext | None = None
        #: Folder with ca.pem, cert.pem and key.pem (mutual TLS), when TLS is on.
        self.cert_path: str | None = None
        if parsed.scheme in ("unix", "http+unix", ""):
            self.unix_path = parsed.path or DEFAULT_SOCKET
        elif parsed.scheme in ("tcp", "http", "https"):
            self.host = parsed.hostname or "127.0.0.1"
            tls = (
                tls_dir is not None
                or parsed.scheme == "https"
                or os.environ.get("DOCKER_TLS_VERIFY", "") not in ("", "0")
            )
            self.port = parsed.port or (2376 if tls else 2375)
            if tls:
                self.cert_path = tls_dir or os.environ.get("DOCKER_CERT_PATH")
                self.ssl = tls_context(self.cert_path)
        else:
            raise EngineUnavailable(f"unsupported DOCKER_HOST scheme in {url!r} (unix, tcp)")

    def docker_py_tls(self) -> Any:
        """docker-py's TLS setting for this endpoint: False, or a config with the same CA
        and client certificate as our own connections."""
        if self.ssl is None:
            return False
        if self.cert_path is None:
            return True
        import docker.tls  # noqa: PLC0415 - docker-py is only needed where it is used

        ca = os.path.join(self.cert_path, "ca.pem")
        cert = (os.path.join(self.cert_path, "cert.pem"), os.path.join(self.cert_path, "key.pem"))
        return docker.tls.TLSConfig(client_cert=cert, ca_cert=ca, verify=ca)

    @property
    def local(self) -> bool:
        return self.unix_path is not None or self.host in ("127.0.0.1", "localhost", "::1")

    async def connect_protocol(self, factory: Callable[[], P]) -> P:
        """A connection driven by our own protocol object."""
        loop = asyncio.get_running_loop()
        try:
            if self.unix_path is not None:
                _, protocol = await loop.create_unix_connection(factory, self.unix_path)
            else:
                _, protocol = await loop.create_connection(
                    factory, self.host, self.port, ssl=self.ssl
                )
        except OSError as exc:
            raise EngineUnavailable(
                f"cannot connect to the Docker engine at {self.url}: {exc}"
            ) from exc
        return protocol

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        try:
            if self.unix_path is not None:
                return await asyncio.open_unix_connection(self.unix_path, limit=READ_SIZE)
            return await asyncio.open_connection(
                self.host, self.port, ssl=self.ssl, limit=READ_SIZE
            )
        except OSError as exc:
            raise EngineUnavailable(
                f"cannot connect to the Docker engine at {self.url}: {exc}"
            ) from exc
