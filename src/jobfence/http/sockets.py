"""Listening sockets for ASGI servers handed a socket (``uvicorn.Server.serve(sockets=…)``).

asyncio sets ``TCP_NODELAY`` on an accepted connection only when the listening socket says
``IPPROTO_TCP`` (``socket.socket()`` says protocol 0). Without it a keep-alive response
written in two pieces (headers, then body) waits for the client's delayed ACK: ~40 ms per
request on loopback instead of well under one. Open every socket a server is handed here.
"""

from __future__ import annotations

import socket


def tcp_listen_socket(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    """A bound TCP socket on ``host:port`` (0: any free port) that asyncio will serve with
    ``TCP_NODELAY``; read the port back with ``sock.getsockname()[1]``."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except BaseException:
        sock.close()
        raise
    return sock
