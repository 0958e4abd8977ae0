"""A prefill worker for bench_pd.py with a plain-socket baseline beside it in the same process: ``python
benchmarks/pd_worker.py BASELINE_PORT serve --role prefill ...``. The baseline thread answers each connection's
8-byte little-endian length with that many bytes from a preallocated buffer (``sendall``, the socket buffer the
engine's transport asks for), so the benchmark can set the engine's KV transport beside a plain socket between
the same two processes. Not part of the engine."""

from __future__ import annotations

import socket
import struct
import sys
import threading

from atom_engine.pd.tcp import SOCKET_BUFFER

_buffer = bytearray()
_lock = threading.Lock()


def payload(n: int) -> memoryview:
    """``n`` bytes of written memory (an untouched buffer would be the kernel's zero page: cache-hot, too fast)."""
    global _buffer
    with _lock:
        if len(_buffer) < n:
            _buffer = bytearray(b"\xa5") * n
        return memoryview(_buffer)[:n]


def serve_baseline(port: int) -> None:
    listener = socket.create_server(("127.0.0.1", port))

    def one(conn: socket.socket) -> None:
        with conn:
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER)  # as the engine's transport asks
            (n,) = struct.unpack("<Q", conn.recv(8, socket.MSG_WAITALL))
            conn.sendall(payload(n))

    while True:
        conn, _ = listener.accept()
        threading.Thread(target=one, args=(conn,), daemon=True).start()


def main(argv: list[str]) -> int:
    from atom_engine import cli

    threading.Thread(target=serve_baseline, args=(int(argv[0]),), daemon=True).start()
    return cli.main(argv[1:])


if __name__ == "__main__":
    from atom_engine.cli import exit_process

    exit_process(main(sys.argv[1:]))  # the engine's own way out (atom_engine.cli.entrypoint)
