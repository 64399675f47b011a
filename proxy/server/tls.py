"""The TLS material of the proxy, loaded with errors that name the setting, the file and
the reason: at start, and at every reload.

Each load builds a new ``ssl.SSLContext``. A TLS connection keeps the context it was
accepted (or opened) with, so putting a new one in the server's hands changes what the
next handshakes present or verify, and nothing of the connections already open.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import ssl
from dataclasses import dataclass
from pathlib import Path

from proxy.net.connect import upstream_ssl_context
from proxy.settings import ConfigError

_CERTIFICATE = re.compile(rb"-----BEGIN CERTIFICATE-----\s*(.+?)\s*-----END CERTIFICATE-----", re.DOTALL)
_PRIVATE_KEY = re.compile(rb"-----BEGIN (?:[A-Z]+ )?PRIVATE KEY-----")


@dataclass(frozen=True)
class ListenerTls:
    """What the client-facing listeners present."""

    context: ssl.SSLContext
    certfile: str
    fingerprint: str  # SHA-256 of the leaf certificate, as ``openssl x509 -noout -fingerprint -sha256`` shows it


def certificate_fingerprint(pem: bytes) -> str | None:
    """The SHA-256 fingerprint of the first certificate in ``pem`` (the leaf of a chain),
    colon-separated hex; None when it holds no well-formed PEM certificate."""
    found = _CERTIFICATE.search(pem)
    if found is None:
        return None
    try:
        der = base64.b64decode(b"".join(found.group(1).split()), validate=True)
    except binascii.Error:
        return None
    return ":".join(f"{byte:02X}" for byte in hashlib.sha256(der).digest())


class _EncryptedKey(Exception):
    pass


def _no_passphrase() -> bytes:
    # OpenSSL would otherwise prompt on the terminal for a passphrase: never in a server
    raise _EncryptedKey


def _read(key: str, path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"{key}: cannot read {path!r}: {exc.strerror or exc}") from None


def load_listener_tls(certfile: str, keyfile: str) -> ListenerTls:
    """A server context presenting the certificate chain in ``certfile`` with the key in
    ``keyfile``. ConfigError naming the setting, the file and the reason when either cannot
    be read, holds no PEM certificate or key, or the key does not match the certificate."""
    fingerprint = certificate_fingerprint(_read("ssl.listener.certfile", certfile))
    if fingerprint is None:
        raise ConfigError(f"ssl.listener.certfile: {certfile!r} holds no PEM certificate")
    if _PRIVATE_KEY.search(_read("ssl.listener.keyfile", keyfile)) is None:
        raise ConfigError(f"ssl.listener.keyfile: {keyfile!r} holds no PEM private key")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(certfile, keyfile, password=_no_passphrase)
    except _EncryptedKey:
        raise ConfigError(f"ssl.listener.keyfile: the key in {keyfile!r} is encrypted; give it unencrypted "
                          f"(the proxy asks for no passphrase)") from None
    except ssl.SSLError as exc:
        if exc.reason == "KEY_VALUES_MISMATCH":
            raise ConfigError(f"ssl.listener.keyfile: the key in {keyfile!r} does not match the certificate in "
                              f"{certfile!r}") from None
        raise ConfigError(f"ssl.listener.certfile, ssl.listener.keyfile: {certfile!r} with {keyfile!r} cannot be "
                          f"used: {exc.reason or exc}") from None
    except OSError as exc:  # replaced between the reads above and this one
        raise ConfigError(f"ssl.listener.certfile, ssl.listener.keyfile: cannot read {certfile!r} or {keyfile!r}: "
                          f"{exc.strerror or exc}") from None
    return ListenerTls(context, certfile, fingerprint)


def load_upstream_tls(cafile: str, check_hostname: bool) -> ssl.SSLContext:
    """A client context for the brokers, verifying them with ``cafile`` (empty: the
    system's store). ConfigError naming the file and the reason when it cannot be used."""
    if cafile and certificate_fingerprint(_read("ssl.upstream.cafile", cafile)) is None:
        raise ConfigError(f"ssl.upstream.cafile: {cafile!r} holds no PEM certificate")
    try:
        return upstream_ssl_context(cafile, check_hostname)
    except ssl.SSLError as exc:
        raise ConfigError(f"ssl.upstream.cafile: {cafile!r} cannot be used: {exc.reason or exc}") from None
    except OSError as exc:
        raise ConfigError(f"ssl.upstream.cafile: cannot read {cafile!r}: {exc.strerror or exc}") from None


__all__ = ["ListenerTls", "certificate_fingerprint", "load_listener_tls", "load_upstream_tls"]
