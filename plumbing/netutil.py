"""The listening TCP socket every server role uses (emulator, API test server, manager, controller
probes, plugin metrics).

Why one helper: a response written in two pieces (uvicorn writes headers and body separately)
on a keep-alive connection waits for the peer's delayed ACK (~40 ms on Linux) unless Nagle's
algorithm is off. asyncio switches it off only for sockets whose ``proto`` is ``IPPROTO_TCP``
(``base_events._set_nodelay``), and a socket made with ``socket.socket(family, SOCK_STREAM)`` has
``proto`` 0 — so a pre-bound socket handed to uvicorn served every reused connection 40 ms late.
Here ``TCP_NODELAY`` is set on the listening socket before ``listen()``; Linux copies it to every
accepted socket.
"""

from __future__ import annotations

import socket

from plumbing.errors import PlumbingError

__all__ = ["ListenError", "listen_tcp"]


class ListenError(PlumbingError, OSError):
    """The address cannot be listened on; ``str()`` is the whole one-line message."""

    def __str__(self) -> str:
        return str(self.strerror)


def listen_tcp(
    host: str, port: int, *, backlog: int = 1024, hint: str = "pick another --port"
) -> socket.socket:
    """A bound, listening TCP socket with ``SO_REUSEADDR`` and ``TCP_NODELAY`` (port 0 picks a free
    one). It is inheritable, so a server started by ``os.exec`` can take it over. Raises
    :class:`ListenError` naming the address, the reason and ``hint``."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((host, port))
        sock.listen(backlog)
    except OSError as err:
        sock.close()
        shown = f"[{host}]" if ":" in host else host
        reason = err.strerror or str(err)
        raise ListenError(err.errno, f"cannot listen on {shown}:{port}: {reason}; {hint}") from None
    sock.set_inheritable(True)
    return sock
