"""Test certificates made with the ``openssl`` command: a CA, and server certificates it
signs for 127.0.0.1 with the serial a test chooses, so a test can tell which certificate a
server presents (``served_serial``)."""

from __future__ import annotations

import socket
import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path

_CURVE = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"]  # a P-256 key: made in milliseconds


@dataclass(frozen=True)
class Ca:
    cert: Path
    key: Path


@dataclass(frozen=True)
class ServerCert:
    cert: Path
    key: Path
    serial: int


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_ca(directory: Path, name: str = "test-ca") -> Ca:
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    _openssl("req", "-x509", *_CURVE, "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "2",
             "-subj", f"/CN={name}", "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    return Ca(cert, key)


def make_server_cert(ca: Ca, directory: Path, serial: int, name: str | None = None) -> ServerCert:
    """A certificate for 127.0.0.1 and localhost, signed by ``ca``, with ``serial``."""
    name = name or f"server-{serial}"
    cert, key, request = directory / f"{name}.pem", directory / f"{name}.key", directory / f"{name}.csr"
    extensions = directory / f"{name}.ext"
    extensions.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n")
    _openssl("req", "-new", *_CURVE, "-nodes", "-keyout", str(key), "-out", str(request), "-subj", "/CN=127.0.0.1")
    _openssl("x509", "-req", "-in", str(request), "-CA", str(ca.cert), "-CAkey", str(ca.key),
             "-set_serial", str(serial), "-days", "2", "-out", str(cert), "-extfile", str(extensions))
    return ServerCert(cert, key, serial)


def served_serial(host: str, port: int, cafile: Path, timeout: float = 10.0) -> int:
    """The serial of the certificate a TLS server presents on a fresh connection, verified
    against ``cafile``."""
    context = ssl.create_default_context(cafile=str(cafile))
    with socket.create_connection((host, port), timeout=timeout) as raw:
        with context.wrap_socket(raw, server_hostname=host) as tls:
            peer = tls.getpeercert()
            assert peer is not None, "the server presented no certificate"
            return int(str(peer["serialNumber"]), 16)


__all__ = ["Ca", "ServerCert", "make_ca", "make_server_cert", "served_serial"]
