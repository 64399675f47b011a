"""Opening connections to brokers, in plaintext or TLS."""

from __future__ import annotations

import ssl

import trio


def upstream_ssl_context(cafile: str, check_hostname: bool) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=cafile or None)
    context.check_hostname = check_hostname
    if not check_hostname:
        context.verify_mode = ssl.CERT_REQUIRED if cafile else ssl.CERT_NONE
    return context


def listener_ssl_context(certfile: str, keyfile: str) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(certfile, keyfile)
    return context


async def connect(
    host: str, port: int, *, timeout: float, ssl_context: ssl.SSLContext | None
) -> trio.abc.Stream:
    """A connected stream to ``host:port``, TLS-wrapped and handshaken when asked."""
    with trio.fail_after(timeout):
        stream: trio.abc.Stream = await trio.open_tcp_stream(host, port)
        try:
            stream.setsockopt(trio.socket.IPPROTO_TCP, trio.socket.TCP_NODELAY, 1)
        except (AttributeError, OSError):
            pass
        if ssl_context is not None:
            tls = trio.SSLStream(stream, ssl_context, server_hostname=host, https_compatible=False)
            try:
                await tls.do_handshake()
            except BaseException:
                await trio.aclose_forcefully(stream)
                raise
            stream = tls
        return stream
