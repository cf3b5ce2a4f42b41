"""The local web page of `python predict.py --serve`: draw a digit, watch the model guess.

    python predict.py --serve                 # then open http://127.0.0.1:8000/
    python predict.py --serve --port 8080 --checkpoint checkpoints/mnist_cnn.pt

The page, draw_a_digit.html (nothing from the internet), POSTs each drawing or photo to /predict;
this module (on http.server) answers in JSON what `python predict.py my_digit.png` would answer.
The server is a door into your machine, so it opens little: docs/what-can-go-wrong.md lists how.
"""

import http.client
import io
import ipaddress
import json
import math
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from plumbing.digit_cleanup import ImageProblem

PAGE = Path(__file__).resolve().with_name("draw_a_digit.html")
MAX_BODY = 20 * 1024 * 1024  # bytes: a big phone photo is 5-10 MB
BODIES_HELD = 4 * MAX_BODY  # bytes of pictures in memory at once, all uploads together
ROUTES = {"/": "GET", "/model": "GET", "/predict": "POST"}  # each path's one method
LOOPBACK, EVERY_ADDRESS = ("127.0.0.1", "localhost", "::1"), ("0.0.0.0", "::", "")


def make_server(host: str, port: int, answer: Callable[[bytes], dict], about: dict,
                debug: bool = False) -> ThreadingHTTPServer:
    """A server (not yet serving) for the page; `answer(picture bytes)` gives the JSON result,
    or {"error": why} for a file that is not a readable picture."""
    if not PAGE.is_file():  # a copy of the repo without it: say so, not "cannot listen"
        raise FileNotFoundError(f"the page {PAGE} is missing: restore it from the repository")
    page = PAGE.read_bytes()  # read once: what is served cannot change while it runs
    ## Bounded memory: at most BODIES_HELD bytes of pictures arriving or waiting, one picture
    ## decoded and classified at a time (20 MB can decode to 120 megapixels); torch's thread
    ## pools then do not fight either.
    one_at_a_time = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        server_version = "draw-a-digit"
        ## Slow clients ("slowloris"): each connection has a thread of its own, so one that sends
        ## nothing costs little, but it must not keep its connection for ever. The headers have
        ## one deadline for all their reads, and the body a minimum rate (read_body()): a byte
        ## now and then stretches neither, as it would a socket's timeout, which is for one read.
        header_seconds = 10  # request line and headers: under 2 KB, 4 s at Apache's 500 bytes/s
        ## ...and at most this many bytes, where http.server takes 100 lines of 64 KB (6.4 MB)
        ## in a fraction of that time: twice its longest request line. Browsers send a few KB.
        header_bytes = 128 * 1024
        ## The body: 10 s at most for any bytes to come, and 50 KB/s on average after the first
        ## 10 s, so a 20 MB photo may take 7 minutes (400 kbit/s, a poor mobile link). A drawing
        ## from the page, a few KB, takes milliseconds.
        body_seconds, body_rate = 10, 50_000
        timeout = 60  # seconds for each write of the answer
        ## HTTP/1.0, http.server's default, written out because the refusals rely on it: the
        ## connection closes after each answer, so a body left unread is never read as a request.
        protocol_version = "HTTP/1.0"

        def setup(self) -> None:
            super().setup()  # self.wfile, and the socket's timeout for writes
            self.rfile.close()  # replaced by a reader that keeps one deadline for many reads:
            self.deadline = Deadline(self.connection, self.header_seconds, self.header_bytes)
            self.rfile = io.BufferedReader(self.deadline)

        def do_GET(self) -> None:  # http.server calls do_<METHOD>
            if self.allowed():
                if self.path == "/":
                    self.reply(HTTPStatus.OK, page, "text/html; charset=utf-8")
                else:  # /model
                    self.reply_json(HTTPStatus.OK, about)

        do_HEAD = do_GET  # GET's status and headers, no body (reply() sees to it): for curl -I

        def do_POST(self) -> None:
            if not self.allowed():
                return
            length = self.headers.get("Content-Length")
            if length is None or self.headers.get("Transfer-Encoding") is not None:  # chunked
                self.fail(HTTPStatus.LENGTH_REQUIRED, "send the picture with a Content-Length, "
                          "not chunked")
            elif len(self.headers.get_all("Content-Length", [])) > 1:  # which one is meant?
                self.fail(HTTPStatus.BAD_REQUEST, "more than one Content-Length")
            ## isascii(): isdigit() alone also accepts digits such as "²", which int() refuses.
            elif not (length.isascii() and length.isdigit()):
                self.fail(HTTPStatus.BAD_REQUEST,
                          f"Content-Length {length[:20]!r} is not a whole number")
            else:
                self.receive(length)

        def receive(self, length: str) -> None:
            """Read a body of `length` bytes, classify it, and answer."""
            ## int() refuses over 4,300 digits: a length that long is refused before it sees it.
            digits = length.lstrip("0") or "0"  # leading zeros count as digits for int() too
            if len(digits) > 15 or (size := int(digits)) > MAX_BODY:  # refused unread
                self.fail(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                          f"the picture is over the limit of {MAX_BODY // 2**20} MB")
                return
            self.held = 0  # bytes of this body counted in self.server.held
            try:
                body = self.read_body(size)
                if body is None:  # too slow, or too many pictures at once: answered
                    return
                if not body:
                    self.fail(HTTPStatus.BAD_REQUEST, "the picture is empty (0 bytes)")
                    return
                try:
                    ## The model's turn, only now that the whole picture is in: an upload that
                    ## stalls holds nothing that the others need.
                    with one_at_a_time:
                        result = answer(body)
                except Exception as err:  # a bug: one line here, and the server goes on
                    print(f"error: unexpected {type(err).__name__} while classifying a picture: "
                          f"{str(err).splitlines()[0] if str(err) else ''}", file=sys.stderr)
                    if debug:
                        traceback.print_exc()
                    self.fail(HTTPStatus.INTERNAL_SERVER_ERROR, f"unexpected "
                              f"{type(err).__name__}: a bug in the server; its terminal says more")
                    return
            finally:
                self.server.hold(-self.held)
            self.reply_json(HTTPStatus.BAD_REQUEST if "error" in result else HTTPStatus.OK, result)

        def read_body(self, size: int) -> bytes | None:
            """The body (shorter if the client closed early); or None, answered, if it comes
            too slowly or the pictures in memory would be over BODIES_HELD."""
            body, started = bytearray(), time.monotonic()
            self.deadline.bytes_left = math.inf  # the body has its own limits, below
            while len(body) < size:
                ## Apache's MinRate: each body_rate bytes in put the deadline 1 s later. nginx's
                ## client_body_timeout: a stall ends it after body_seconds all the same, else
                ## bytes sent fast would buy time to stall in, holding their memory.
                self.deadline.at = self.body_seconds + min(time.monotonic(),
                                                           started + len(body) / self.body_rate)
                try:
                    chunk = self.rfile.read1(min(size - len(body), 1 << 16))  # up to 64 KB
                except TimeoutError:
                    self.fail(HTTPStatus.REQUEST_TIMEOUT, "the picture stopped coming or came too "
                              f"slowly: this server waits {self.body_seconds} s at most, and "
                              f"needs {self.body_rate // 1000} KB/s on average")
                    return None
                if not chunk:  # the client closed the connection: a short body
                    break
                ## Counted as they arrive: a stalled upload holds only the bytes it sent.
                if not self.server.hold(len(chunk)):
                    self.fail(HTTPStatus.SERVICE_UNAVAILABLE,
                              "the server is receiving too many pictures at once: try again")
                    return None
                self.held += len(chunk)
                body += chunk
            return bytes(body)

        def send_error(self, code: int, message: str | None = None, explain=None) -> None:
            """http.server's own refusals (a garbled request, an unknown method...) as JSON too."""
            ## A request line it could not read leaves the version at HTTP/0.9, which has no
            ## status line or headers: answer as HTTP/1.0 instead, so the status is seen.
            if self.request_version == "HTTP/0.9":
                self.request_version = "HTTP/1.0"
            error = message or HTTPStatus(code).phrase
            self.fail(HTTPStatus(code), f"{error}: {explain}" if explain else error)

        def allowed(self) -> bool:
            """Check the Host header, the path and the method (HEAD as GET); answer any error."""
            method = "GET" if self.command == "HEAD" else self.command
            path = self.path.split("?")[0]
            allow = ROUTES.get(path)
            if not host_allowed(self.headers.get("Host", ""), host, self.server.server_port):
                self.fail(HTTPStatus.FORBIDDEN, "this server answers only requests addressed to it")
            elif allow is None:
                self.fail(HTTPStatus.NOT_FOUND, f"no page {path[:80]}")
            elif method != allow:  # 405, with the Allow header that HTTP asks for
                self.fail(HTTPStatus.METHOD_NOT_ALLOWED, f"{path} takes {allow}", allow)
            else:
                self.path = path
                return True
            return False

        do_PUT = do_DELETE = do_PATCH = do_OPTIONS = allowed  # 405, or 404 for an unknown path

        def fail(self, status: HTTPStatus, error: str, allow: str | None = None) -> None:
            self.reply_json(status, {"error": error}, allow)

        def reply_json(self, status: HTTPStatus, data: dict, allow: str | None = None) -> None:
            self.reply(status, json.dumps(data).encode(), "application/json", allow)

        def reply(self, status: HTTPStatus, body: bytes, content_type: str,
                  allow: str | None = None) -> None:
            self.connection.settimeout(self.timeout)  # not the read deadline's time left
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.send_header("X-Content-Type-Options", "nosniff")
            if allow:
                self.send_header("Allow", allow)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def log_message(self, format: str, *args) -> None:  # noqa: A002
            pass  # one line per stroke would drown the terminal; errors are printed above

    class Server(ThreadingHTTPServer):
        request_queue_size = 64  # connections waiting; the default 5 resets some in a burst
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET  # ::1 is IPv6
        classifying = one_at_a_time  # serve() waits on it at Ctrl-C
        held, holding = 0, threading.Lock()  # bytes of pictures in memory now, all uploads

        def hold(self, size: int) -> bool:
            """Count `size` bytes more in memory (fewer if negative), unless over BODIES_HELD."""
            with self.holding:  # one thread at a time: `+=` alone is not atomic
                if self.held + size > BODIES_HELD:
                    return False
                self.held += size
                return True

        def handle_error(self, request, client_address) -> None:
            ## A browser that goes away before its answer (a reload, a closed tab) breaks the
            ## connection mid-reply: nothing is wrong, so no traceback. Other errors are bugs.
            if not isinstance(sys.exc_info()[1], ConnectionError):
                super().handle_error(request, client_address)

    return Server((host, port), Handler)


class Deadline(io.RawIOBase):
    """A socket's reads, each allowed only the time left until `at` (a time.monotonic()): a
    deadline for many reads together, where a socket's timeout is for each read alone. Beyond
    `bytes_left` bytes in all, a read raises what http.server answers with 431."""

    def __init__(self, connection: socket.socket, seconds: float, most: float) -> None:
        self.connection, self.at, self.bytes_left = connection, time.monotonic() + seconds, most

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if (left := self.at - time.monotonic()) <= 0:
            raise TimeoutError("the client is too slow")  # http.server closes the connection
        if self.bytes_left <= 0:
            raise http.client.HTTPException("the request's headers are over the server's limit")
        self.connection.settimeout(left)
        size = self.connection.recv_into(buffer)
        self.bytes_left -= size
        return size


def host_allowed(header: str, host: str, port: int) -> bool:
    """Whether a request's Host header names this server, as it listens on host:port."""
    ## DNS rebinding: a page on another site can point a domain name it controls at 127.0.0.1, and
    ## the browser then sends that name as the Host. Only this server's names pass, and the IP
    ## addresses that a --host 0.0.0.0 server is reached by, which are safe: rebinding needs a name.
    if header.startswith("["):  # [::1]:8000
        name, _, rest = header[1:].partition("]")
        given_port = rest.removeprefix(":")
    elif header.count(":") == 1:  # 127.0.0.1:8000, localhost:8000
        name, given_port = header.split(":")
    else:  # no port given (80), or a bare IPv6 address
        name, given_port = header, ""
    if given_port != str(port) and not (given_port == "" and port == 80):
        return False
    name = name.lower()
    if host in LOOPBACK:
        return name in LOOPBACK
    if host in EVERY_ADDRESS:
        me = socket.gethostname().lower()  # macOS and many Linux machines also answer to .local
        return is_ip(name) or name in ("localhost", me, me.removesuffix(".local") + ".local")
    return name == host.lower() or (is_ip(name) and is_ip(host)
                                    and ipaddress.ip_address(name) == ipaddress.ip_address(host))


def is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def page_answer(classify: Callable) -> Callable[[bytes], dict]:
    """The page's answer to a picture's bytes, from `classify` (predict.read_and_classify, its
    model chosen): its result and the 28 x 28 input the model saw, or {"error": why}."""
    def answer(picture: bytes) -> dict:
        try:
            result, digit, _ = classify(io.BytesIO(picture))
        except ImageProblem as err:
            return {"error": f"the picture {err}"}
        return {**result, "input": (digit * 255).round().byte().tolist()}

    return answer


def run(args, path: Path, checkpoint: dict, classify: Callable) -> int:
    """`predict.py --serve`: make_server() on --host and --port for the checkpoint at `path`,
    then serve() until Ctrl-C; a port or host that fails is one line, code 2."""
    host, port = args.host, args.port
    about = {"checkpoint": str(path), "model": checkpoint["model_name"],
             "epoch": checkpoint.get("epoch"), "val_accuracy": checkpoint.get("val_accuracy"),
             "classes": checkpoint["classes"]}
    try:
        server = make_server(host, port, page_answer(classify), about, args.debug)
    except OSError as err:
        if isinstance(err, FileNotFoundError):  # the page
            print(f"error: {err}", file=sys.stderr)
        elif err.errno in (98, 48, 10048):  # EADDRINUSE on Linux, macOS, Windows
            print(f"error: port {port} on {host} is already in use (by another program, or this "
                  f"page): pass --port {port + 1 if port < 65535 else 8001}", file=sys.stderr)
        else:  # a host name that does not resolve, an address not on this machine
            print(f"error: cannot listen on {host} port {port}: {err.strerror or err}. Check "
                  "--host (127.0.0.1 for this machine only).", file=sys.stderr)
        return 2
    serve(server, host)  # returns only if the server is shut down from another thread
    return 0  # Ctrl-C raises KeyboardInterrupt instead, for the caller's one line and code 130


def serve(server: ThreadingHTTPServer, host: str) -> None:
    """Say where the page is, then serve until Ctrl-C (which raises KeyboardInterrupt)."""
    port = server.server_port
    ## Every address of the machine: its loopback in the same family (on Windows, an IPv6
    ## socket takes no IPv4 connections, so 127.0.0.1 would not reach a server on "::").
    shown = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(host, host)
    print(f"Open http://{shown if ':' not in shown else f'[{shown}]'}:{port}/ in a browser "
          "to draw a digit. Ctrl-C to stop.", flush=True)
    if host not in LOOPBACK:
        where = "every address of this machine" if host in EVERY_ADDRESS else host
        print(f"note: listening on {where}: other machines on your network can use this page "
              f"too, at http://{socket.gethostname()}:{port}/ or this machine's IP address.",
              flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
        ## Ctrl-C may come mid-picture. Python before 3.14 stops the daemon threads (one per
        ## connection) at exit wherever they are: one inside torch's C++ code aborts the process
        ## ("terminate called without an active exception", cpython#87135). Wait, keep the lock.
        server.classifying.acquire(timeout=30)
