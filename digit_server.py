"""The local web page of `python predict.py --serve`: draw a digit, watch the model guess.

    python predict.py --serve                 # then open http://127.0.0.1:8000/
    python predict.py --serve --port 8080 --checkpoint checkpoints/mnist_cnn.pt

The page (draw_a_digit.html, one file with its CSS and JavaScript, nothing from the internet)
sends each drawing, or a photo chosen or dropped on it, as the bytes of a picture file to
POST /predict. This module only speaks HTTP: it hands those bytes to the function predict.py
gives it, which runs exactly what `python predict.py my_digit.png` runs, and sends back its
JSON. Built on the standard library's http.server, so it needs nothing to install.

The server is a door into your machine, so it opens little: it listens on 127.0.0.1 unless
told otherwise, serves the page and nothing else from disk, answers only requests addressed to
it by name (no DNS rebinding), refuses bodies over MAX_BODY before reading them, holds at
most 4 uploads at once and classifies one picture at a time, so that memory stays bounded (a
client that has not sent its request within a minute is dropped).
"""

from __future__ import annotations

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

PAGE = Path(__file__).resolve().with_name("draw_a_digit.html")
MAX_BODY = 20 * 1024 * 1024  # bytes: a big phone photo is 5-10 MB
ROUTES = {"/": ("GET",), "/model": ("GET",), "/predict": ("POST",)}


class PortInUse(Exception):
    """The port is taken by another program (or another server of this page)."""


def make_server(host: str, port: int, answer: Callable[[bytes], dict], about: dict,
                debug: bool = False) -> ThreadingHTTPServer:
    """A server (not yet serving) for the page; `answer(picture bytes)` gives the JSON result,
    or {"error": why} for a file that is not a readable picture."""
    if not PAGE.is_file():  # a copy of the repo without it: say so, not "cannot listen"
        raise FileNotFoundError(f"the page {PAGE} is missing: restore it from the repository")
    page = PAGE.read_bytes()  # read once: what is served cannot change while it runs
    ## Bounded memory: at most 4 bodies of up to MAX_BODY are held at once, and one picture at
    ## a time is decoded and classified (a 20 MB upload can decode to 120 megapixels). Torch
    ## then runs one inference at a time too, instead of several thread pools fighting over
    ## the cores.
    uploads = threading.BoundedSemaphore(4)
    one_at_a_time = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        server_version = "draw-a-digit"
        timeout = 60  # seconds a client may take to send a request (and any one read of it)

        def do_GET(self) -> None:  # http.server calls do_<METHOD>
            if self.allowed("GET"):
                if self.path == "/":
                    self.reply(HTTPStatus.OK, page, "text/html; charset=utf-8")
                else:  # /model
                    self.reply_json(HTTPStatus.OK, about)

        ## HEAD: GET's status and headers without the body (reply() leaves it out), as
        ## `curl -I` and link checkers expect of any page.
        do_HEAD = do_GET

        def do_POST(self) -> None:
            if not self.allowed("POST"):
                return
            if self.headers.get("Transfer-Encoding") is not None:  # chunked: a length unknown
                self.close_connection = True
                self.reply_json(HTTPStatus.LENGTH_REQUIRED,
                                {"error": "send the picture with a Content-Length, not chunked"})
                return
            if len(self.headers.get_all("Content-Length", [])) > 1:  # which one is meant?
                self.close_connection = True
                self.reply_json(HTTPStatus.BAD_REQUEST, {"error": "more than one Content-Length"})
                return
            length = self.headers.get("Content-Length")
            if length is None:
                self.reply_json(HTTPStatus.LENGTH_REQUIRED,
                                {"error": "send the picture with a Content-Length"})
                return
            ## isascii(): isdigit() alone also accepts digits such as "²", which int() refuses.
            if not (length.isascii() and length.isdigit()):
                self.close_connection = True  # where this body ends is unknown
                self.reply_json(HTTPStatus.BAD_REQUEST,
                                {"error": f"Content-Length {length[:20]!r} is not a whole number"})
                return
            ## int() refuses more than 4,300 digits (a guard against slow conversions): a length
            ## that long is far over the limit anyway, and is refused before int() sees it.
            digits = length.lstrip("0") or "0"  # leading zeros count as digits for int() too
            size = int(digits) if len(digits) <= 15 else None
            if size is None or size > MAX_BODY:  # refused unread; the connection is then closed
                self.close_connection = True
                said = (f"{math.ceil(size / 2**20 * 10) / 10} MB" if size is not None  # 20.1
                        else "far too large")
                self.reply_json(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                                {"error": f"the picture is {said}; the limit is "
                                          f"{MAX_BODY // 2**20} MB"})
                return
            ## A slot for the body: all 4 held (by slow uploads, say) for a whole minute is busy.
            if not uploads.acquire(timeout=self.timeout):
                self.close_connection = True
                self.reply_json(HTTPStatus.SERVICE_UNAVAILABLE,
                                {"error": "the server is busy with other uploads: try again"})
                return
            try:
                body = self.read_body(size)
                if body is None:  # not sent within the minute: a stalled client
                    self.close_connection = True
                    self.reply_json(HTTPStatus.REQUEST_TIMEOUT,
                                    {"error": f"the picture did not arrive within "
                                              f"{self.timeout} s"})
                    return
                if not body:
                    self.reply_json(HTTPStatus.BAD_REQUEST,
                                    {"error": "the picture is empty (0 bytes)"})
                    return
                try:
                    with one_at_a_time:
                        result = answer(body)
                except Exception as err:  # a bug: one line here, and the server goes on
                    print(f"error: unexpected {type(err).__name__} while classifying a picture: "
                          f"{str(err).splitlines()[0] if str(err) else ''}", file=sys.stderr)
                    if debug:
                        traceback.print_exc()
                    self.reply_json(HTTPStatus.INTERNAL_SERVER_ERROR,
                                    {"error": f"unexpected {type(err).__name__}: a bug in the "
                                              "server; its terminal says more"})
                    return
            finally:
                uploads.release()
            self.reply_json(HTTPStatus.BAD_REQUEST if "error" in result else HTTPStatus.OK, result)

        def read_body(self, size: int) -> bytes | None:
            """The body's bytes (fewer if the client closed early), or None if they do not all
            arrive within `timeout` seconds: a client that sends a byte now and then would
            otherwise hold its upload slot for ever, as each read gets something in time."""
            deadline, chunks, left = time.monotonic() + self.timeout, [], size
            while left > 0:
                if (remaining := deadline - time.monotonic()) <= 0:
                    return None
                self.connection.settimeout(remaining)
                try:
                    chunk = self.rfile.read1(min(left, 1 << 16))  # what has arrived, up to 64 KB
                except TimeoutError:
                    return None
                if not chunk:  # the client closed the connection: a short body
                    break
                chunks.append(chunk)
                left -= len(chunk)
            self.connection.settimeout(self.timeout)  # the next request gets its full minute
            return b"".join(chunks)

        def refuse(self) -> None:  # the usual other methods get 405, or 404 for an unknown path
            self.allowed(self.command)

        do_PUT = do_DELETE = do_PATCH = do_OPTIONS = refuse

        def send_error(self, code: int, message: str | None = None,
                       explain: str | None = None) -> None:
            """http.server's own refusals (a garbled request, a method it does not know: 400,
            501...) as one-line JSON too, instead of its HTML page."""
            self.close_connection = True
            ## A request line it could not read leaves the version at HTTP/0.9, which has no
            ## status line or headers: answer as HTTP/1.0 instead, so the status is seen.
            if self.request_version == "HTTP/0.9":
                self.request_version = "HTTP/1.0"
            status = HTTPStatus(code)
            self.reply_json(status, {"error": message or status.phrase})

        def allowed(self, method: str) -> bool:
            """Check the Host header, the path and the method; answer the error if any."""
            if not host_allowed(self.headers.get("Host", ""), host, self.server.server_port):
                self.reply_json(HTTPStatus.FORBIDDEN, {"error": "this server answers only "
                                                                "requests addressed to it"})
                return False
            path = self.path.split("?")[0]
            if path not in ROUTES:
                self.reply_json(HTTPStatus.NOT_FOUND, {"error": f"no page {path[:80]}"})
                return False
            if method not in ROUTES[path]:
                self.reply_json(HTTPStatus.METHOD_NOT_ALLOWED,
                                {"error": f"{path} takes {' or '.join(ROUTES[path])}"},
                                allow=", ".join(ROUTES[path]))
                return False
            self.path = path
            return True

        def reply_json(self, status: HTTPStatus, data: dict, allow: str | None = None) -> None:
            self.reply(status, json.dumps(data).encode(), "application/json", allow)

        def reply(self, status: HTTPStatus, body: bytes, content_type: str,
                  allow: str | None = None) -> None:
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
        ## Connections waiting to be accepted: with the default 5, a burst of 100 requests at
        ## once had some connections reset.
        request_queue_size = 64
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET  # ::1 is IPv6
        daemon_threads = True  # Ctrl-C does not wait for open connections

        def handle_error(self, request, client_address) -> None:
            ## A browser that goes away before its answer (a reload, a closed tab) breaks the
            ## connection mid-reply: nothing is wrong here, so no traceback. Any other error
            ## in the handler is a bug, and keeps the standard library's traceback.
            if not isinstance(sys.exc_info()[1], ConnectionError):
                super().handle_error(request, client_address)

    try:
        server = Server((host, port), Handler)
    except OSError as err:
        if err.errno in (98, 48, 10048):  # EADDRINUSE on Linux, macOS, Windows
            raise PortInUse(f"port {port} on {host} is already in use, by another program or "
                            "another server of this page: pass --port with another number, "
                            f"such as --port {port + 1 if port < 65535 else 8001}") from err
        raise
    server.one_at_a_time = one_at_a_time  # serve() waits on it at Ctrl-C
    return server


def host_allowed(header: str, host: str, port: int) -> bool:
    """Whether a request's Host header names this server, as it listens on host:port."""
    ## A web page on another site can make the browser send requests to 127.0.0.1 through a
    ## domain name it controls that it points at 127.0.0.1 ("DNS rebinding"); the browser then
    ## sends that name as the Host. Names other than the ones this server is known by are
    ## refused. A server shared on the network (--host 0.0.0.0) is reached by its IP
    ## addresses, which are safe: rebinding needs a name.
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
    if host in ("127.0.0.1", "localhost", "::1"):
        return name in ("127.0.0.1", "localhost", "::1")
    if host in ("0.0.0.0", "::", ""):  # every address of this machine
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


def run(host: str, port: int, answer: Callable[[bytes], dict], about: dict,
        debug: bool = False) -> int:
    """make_server(), then serve() until Ctrl-C; a port or host that fails is one line, code 2."""
    try:
        server = make_server(host, port, answer, about, debug)
    except (PortInUse, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # a host name that does not resolve, an address not on this machine
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
    if host not in ("127.0.0.1", "localhost", "::1"):
        everywhere = host in ("0.0.0.0", "::", "")
        reach = (f"http://{socket.gethostname()}:{port}/ or this machine's IP address"
                 if everywhere else "the address above")
        where = "every address of this machine" if everywhere else host
        print(f"note: listening on {where}: other machines on your network can use this page "
              f"too, at {reach}.", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
        ## Ctrl-C may come while a request's thread is classifying a picture. Python stops
        ## such (daemon) threads at exit wherever they are, and one stopped inside torch's C++
        ## code aborts the whole process ("terminate called without an active exception")
        ## instead of letting it end with one line. So: wait for that picture (at most 30 s),
        ## and keep the lock, so that no other starts. (Python 3.14 no longer stops them so:
        ## https://github.com/python/cpython/issues/87135.)
        server.one_at_a_time.acquire(timeout=30)
