"""Opening connections to brokers, in plaintext or TLS (the listeners' TLS is
``proxy.server.tls``'s)."""

from __future__ import annotations

import ssl

import trio


def upstream_ssl_context(cafile: str, check_hostname: bool) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=cafile or None)
    context.check_hostname = check_hostname
    if not check_hostname:
        context.verify_mode = ssl.CERT_REQUIRED if cafile else ssl.CERT_NONE
    return context


def tune_socket(stream: trio.abc.Stream, send_buffer: int) -> None:
    """Let a whole frame go to the kernel in one write on the socket under ``stream``.

    trio limits a socket's unsent bytes to 16 KiB (TCP_NOTSENT_LOWAT), which suits
    interactive streams but splits every 1 MB Fetch response into dozens of writes and
    wake-ups; 0 restores the system default (no limit). ``send_buffer`` sets SO_SNDBUF
    (-1 leaves the operating system's autotuning).
    """
    sock = getattr(getattr(stream, "transport_stream", stream), "socket", None)
    if sock is None:
        return
    try:
        if hasattr(trio.socket, "TCP_NOTSENT_LOWAT"):
            sock.setsockopt(trio.socket.IPPROTO_TCP, trio.socket.TCP_NOTSENT_LOWAT, 0)
        if send_buffer >= 0:
            sock.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_SNDBUF, send_buffer)
    except OSError:
        pass  # a closed or odd socket keeps its defaults; nothing else changes


async def connect(
    host: str, port: int, *, timeout: float, ssl_context: ssl.SSLContext | None
) -> trio.abc.Stream:
    """A connected stream to ``host:port``, TLS-wrapped and handshaken when asked."""
    with trio.fail_after(timeout):
        tcp = await trio.open_tcp_stream(host, port)
        try:
            tcp.setsockopt(trio.socket.IPPROTO_TCP, trio.socket.TCP_NODELAY, 1)
        except OSError:
            pass
        stream: trio.abc.Stream = tcp
        if ssl_context is not None:
            tls = trio.SSLStream(stream, ssl_context, server_hostname=host, https_compatible=False)
            try:
                await tls.do_handshake()
            except BaseException:
                await trio.aclose_forcefully(stream)
                raise
            stream = tls
        return stream
