"""A TCP relay on loopback that a test holds: each connection it accepts is
piped to a new connection to `target`. When the target's side ends, the
accepted side is held open (what it sends is read and dropped) until the
test calls `cut()`: so a client whose server connection runs through the
relay sees its server go only when the test says, after the workers, which
talk to the server directly, have. After `cut()` the relay passes endings
through at once."""
import select
import socket
import threading


class Relay:
    def __init__(self, target):
        host, port = target.rsplit(":", 1)
        self._target = (host, int(port))
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(16)
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._lock = threading.Lock()
        self._held = []  # accepted sockets whose target side ended
        self._hold = True
        self._closed = threading.Event()
        # How many accepted connections lost their target side while held.
        self.held_count = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def cut(self):
        """Ends every held connection, and holds none from now on."""
        with self._lock:
            self._hold = False
            held, self._held = self._held, []
        for conn in held:
            _close(conn)

    def close(self):
        self._closed.set()
        self.cut()
        _close(self._listener)

    def _accept(self):
        while not self._closed.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return  # closed
            try:
                upstream = socket.create_connection(self._target, timeout=5)
            except OSError:
                _close(conn)  # the target is down: the client tries again
                continue
            threading.Thread(target=self._pump, args=(conn, upstream),
                             daemon=True).start()

    def _pump(self, conn, upstream):
        # Bounded by the relay's life: every wait is a 0.2 s select that
        # looks at the flags again.
        while not self._closed.is_set():
            ready, _, _ = select.select([conn, upstream], [], [], 0.2)
            if conn in ready:
                data = _recv(conn)
                if not data:
                    break  # the client ended it
                try:
                    upstream.sendall(data)
                except OSError:
                    break
            if upstream in ready:
                data = _recv(upstream)
                if not data:
                    _close(upstream)
                    self._hold_open(conn)
                    return
                try:
                    conn.sendall(data)
                except OSError:
                    break
        _close(conn)
        _close(upstream)

    def _hold_open(self, conn):
        with self._lock:
            if not self._hold:
                _close(conn)
                return
            self._held.append(conn)
            self.held_count += 1
        # Drain what the client still writes until the test cuts it.
        while not self._closed.is_set():
            try:
                ready, _, _ = select.select([conn], [], [], 0.2)
            except (OSError, ValueError):
                return  # cut
            if ready and not _recv(conn):
                return


def _recv(sock):
    try:
        return sock.recv(65536)
    except OSError:
        return b""


def _close(sock):
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
