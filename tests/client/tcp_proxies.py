"""TCP proxies in front of a real server, standing for a link or a server that stops: the robot
client's tests of close, send and reply deadlines."""

from __future__ import annotations

import contextlib
import socket
import threading


class _Proxy:
    """Listens on 127.0.0.1 (``port``) and forwards to ``target`` (the subclass's ``_accept``);
    ``close()`` closes every socket, so a send still blocked on one fails then (the test is over)."""

    def __init__(self, target: tuple[str, int], receive_buffer: int | None = None) -> None:
        self.target = target
        self._listener = socket.socket()
        if receive_buffer is not None:  # inherited by accepted sockets: the client's buffers fill sooner
            self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen()
        self.port = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = [self._listener]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.close()


class FreezableProxy(_Proxy):
    """Forwards one TCP connection to ``target``; once ``frozen`` is set it forwards nothing more in
    either direction and counts the bytes the client still sends. ``client_closed`` is set when the
    client's side of the connection ends."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.frozen = threading.Event()
        self.client_closed = threading.Event()
        self.sent_while_frozen = 0
        super().__init__(target)

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            client, _ = self._listener.accept()
            upstream = socket.create_connection(self.target)
            self._sockets += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, from_client: bool) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                if not self.frozen.is_set():
                    sink.sendall(data)
                elif from_client:
                    self.sent_while_frozen += len(data)
        if from_client:
            self.client_closed.set()


class StallingProxy(_Proxy):
    """Forwards TCP connections to ``target``. ``stall()`` stops reading from (and forwarding on) the
    connections open at that moment, for good, and holds new ones until ``resume()``: the server
    froze, then came back. Its receive buffer is small, so the client's socket buffers fill sooner."""

    def __init__(self, target: tuple[str, int]) -> None:
        self._open = threading.Event()
        self._open.set()
        self._stalled = threading.Event()  # set for the connections of the stalled generation
        super().__init__(target, receive_buffer=4096)

    def stall(self) -> None:
        self._open.clear()
        self._stalled.set()

    def resume(self) -> None:
        self._stalled = threading.Event()  # the stalled connections stay stalled; new ones are served
        self._open.set()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = self._listener.accept()
                self._open.wait()  # a connection that arrives while stalled waits for resume()
                upstream = socket.create_connection(self.target)
                self._sockets += [client, upstream]
                stalled = self._stalled
                for source, sink in ((client, upstream), (upstream, client)):
                    args = (source, sink, stalled)
                    threading.Thread(target=self._pump, args=args, daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket, stalled: threading.Event) -> None:
        with contextlib.suppress(OSError):
            while not stalled.is_set() and (data := source.recv(65536)):
                if stalled.is_set():
                    return
                sink.sendall(data)
