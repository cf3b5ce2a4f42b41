"""digit_server.py and `predict.py --serve`: a real server on 127.0.0.1, real HTTP requests."""

import http.client
import io
import json
import socket
import struct
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import pytest
from helpers import press_ctrl_c, start
from PIL import Image

import predict
from benchmarks.draw_samples import draw_digit
from plumbing import digit_cleanup, digit_server, files

REPO = Path(__file__).resolve().parent.parent


def request(port, method, path, body=None, headers=None, host=None):
    """(status, parsed JSON or the raw bytes) of one request."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    connection.putrequest(method, path, skip_host=True)
    connection.putheader("Host", host or f"127.0.0.1:{port}")
    for name, value in (headers or {}).items():
        connection.putheader(name, value)
    if body is not None and "Content-Length" not in (headers or {}):
        connection.putheader("Content-Length", str(len(body)))
    connection.endheaders(body)
    response = connection.getresponse()
    data = response.read()
    connection.close()
    kind = response.getheader("Content-Type", "")
    return response.status, json.loads(data) if kind.startswith("application/json") else data


def png_bytes(img):
    buffer = io.BytesIO()
    img.save(buffer, format="PNG")
    return buffer.getvalue()


def drawn(digit):
    """A digit drawn with a marker on a white 336-px square, as the page's canvas sends it."""
    return png_bytes(draw_digit(digit, size=(336, 336), height=230, width=22))


def test_a_drawn_digit_gets_the_same_answer_as_the_command_line(page_server, trained_checkpoint,
                                                                 tmp_path, capsys):
    picture = drawn(7)
    status, answer = request(page_server, "POST", "/predict", picture)
    assert status == 200
    assert set(answer) >= {"prediction", "probabilities", "warning", "input"}
    assert len(answer["probabilities"]) == 10 and answer["warning"] is None
    assert len(answer["input"]) == 28 and all(len(row) == 28 for row in answer["input"])
    (tmp_path / "seven.png").write_bytes(picture)
    assert predict.main(["--checkpoint", str(trained_checkpoint), "--json",
                         "--save-input", str(tmp_path / "seen"), str(tmp_path / "seven.png")]) == 0
    [result] = json.loads(capsys.readouterr().out)
    assert answer["prediction"] == result["prediction"]
    assert answer["probabilities"] == result["probabilities"]
    ## the input it reports is the picture predict.py saved as what the model saw
    seen = Image.open(tmp_path / "seen" / "seven.png")
    assert list(seen.tobytes()) == [v for row in answer["input"] for v in row]


def test_the_page_and_the_checkpoint_it_names_are_served(page_server, trained_checkpoint):
    status, page = request(page_server, "GET", "/")
    assert status == 200 and b"<canvas" in page and b"/predict" in page
    assert b"http://" not in page and b"https://" not in page  # nothing from the internet
    status, about = request(page_server, "GET", "/model")
    assert status == 200 and about["model"] == "mlp" and about["checkpoint"] == str(
        trained_checkpoint) and 0 < about["val_accuracy"] <= 1


@pytest.mark.parametrize("body, message", [
    (b"", "the picture is empty (0 bytes)"),
    (b"hello, not a picture", "the picture is not an image Pillow can read"),
    (None, "the picture is truncated or damaged"),  # a PNG cut in half
])
def test_a_bad_picture_gets_400_with_one_line_and_the_server_goes_on(page_server, body, message):
    if body is None:
        body = drawn(3)[:500]
    status, answer = request(page_server, "POST", "/predict", body)
    assert status == 400 and answer["error"].startswith(message)
    assert len(answer) == 1 and "\n" not in answer["error"]
    assert request(page_server, "POST", "/predict", drawn(3))[0] == 200


## No Content-Length: 411, "Length Required". One that is not a whole number: 400, as RFC 9112
## (6.3) asks, since where the body ends is unknown.
@pytest.mark.parametrize("length", ["", "twelve", "\u00b2", "-5"])  # "²" passes str.isdigit()
def test_a_missing_or_unreadable_content_length_is_refused(page_server, length):
    headers = {"Content-Length": length} if length else {}
    connection = http.client.HTTPConnection("127.0.0.1", page_server, timeout=60)
    connection.putrequest("POST", "/predict", skip_host=True)
    connection.putheader("Host", f"127.0.0.1:{page_server}")
    for name, value in headers.items():
        connection.putheader(name, value)
    connection.endheaders()
    response = connection.getresponse()
    answer = json.loads(response.read())
    connection.close()
    if length:
        assert response.status == 400 and answer == {
            "error": f"Content-Length {length!r} is not a whole number"}
    else:
        assert response.status == 411 and answer == {
            "error": "send the picture with a Content-Length, not chunked"}
    assert request(page_server, "POST", "/predict", drawn(3))[0] == 200


@pytest.mark.parametrize("request_line, status, error", [
    (b"TRACE / HTTP/1.1", 501, "Unsupported method ('TRACE')"),  # a method http.server lacks
    (b"GET /" + b"a" * 70_000 + b" HTTP/1.1", 414, "Request-URI Too Long"),  # over 64 KiB
    (b"GET / HTTP/1.x", 400, "Bad request version ('HTTP/1.x')"),  # a garbled request line
])
def test_http_servers_own_refusals_are_one_line_json_too(page_server, request_line, status,
                                                         error):
    connection = socket.create_connection(("127.0.0.1", page_server), timeout=30)
    connection.sendall(request_line + f"\r\nHost: 127.0.0.1:{page_server}\r\n\r\n".encode())
    reply = b""
    while chunk := connection.recv(4096):  # the server closes the connection after its reply
        reply += chunk
    connection.close()
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.split()[1] == str(status).encode()
    assert b"Content-Type: application/json" in head and json.loads(body) == {"error": error}
    assert request(page_server, "POST", "/predict", drawn(3))[0] == 200


def hang_up_mid_request(port: int, body: bytes) -> None:
    """Send a whole request, then close the connection at once, before the answer comes back,
    the way a browser does on a reload: with a reset (SO_LINGER 0), so the server's write fails."""
    connection = socket.create_connection(("127.0.0.1", port), timeout=30)
    connection.sendall(f"POST /predict HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                       f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    linger = struct.pack("hh" if sys.platform == "win32" else "ii", 1, 0)  # on, 0 s
    connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
    connection.close()


## A length of 5,000 digits is more than int() converts (4,300): refused all the same.
@pytest.mark.parametrize("length", [str(21 * 2**20), str(20 * 2**20 + 1), "9" * 5000])
def test_a_body_over_the_limit_gets_413_without_being_read(page_server, length):
    ## Only the headers are sent: the server must answer without waiting for 21 MB.
    connection = socket.create_connection(("127.0.0.1", page_server), timeout=30)
    connection.sendall(f"POST /predict HTTP/1.1\r\nHost: 127.0.0.1:{page_server}\r\n"
                       f"Content-Length: {length}\r\n\r\n".encode())
    reply = b""
    while chunk := connection.recv(4096):  # the server closes the connection after its reply
        reply += chunk
    connection.close()
    reply = reply.decode()
    assert reply.startswith("HTTP/1.0 413") or reply.startswith("HTTP/1.1 413")
    assert "the picture is over the limit of 20 MB" in reply
    assert request(page_server, "POST", "/predict", drawn(3))[0] == 200


@pytest.mark.parametrize("method, path, status", [
    ("GET", "/predict", 405), ("POST", "/", 405), ("DELETE", "/predict", 405),
    ("GET", "/nope", 404), ("GET", "/draw_a_digit.html", 404), ("GET", "/../README.md", 404),
    ("GET", "/%2e%2e/predict.py", 404), ("GET", "/digit_server.py", 404),
])
def test_nothing_but_the_page_is_served_and_wrong_methods_are_refused(page_server, method, path,
                                                                       status):
    code, answer = request(page_server, method, path, b"" if method != "GET" else None)
    assert code == status and "error" in answer


def test_head_gets_the_headers_of_get_without_the_body(page_server):
    def answer(method, path):  # (status, Content-Length, bytes of body received)
        connection = http.client.HTTPConnection("127.0.0.1", page_server, timeout=120)
        connection.request(method, path)
        response = connection.getresponse()
        got = response.status, response.getheader("Content-Length"), len(response.read())
        connection.close()
        return got
    page = answer("GET", "/")
    assert answer("HEAD", "/") == (200, page[1], 0) and page[2] > 1000
    assert answer("HEAD", "/predict")[::2] == (405, 0)  # /predict takes POST only


@pytest.mark.parametrize("host", ["evil.example:{port}", "localhost.evil.example:{port}",
                                  "127.0.0.1:1", "192.168.1.5:{port}"])
def test_a_request_addressed_to_another_name_is_refused(page_server, host):
    ## DNS rebinding: a page elsewhere points its own name at 127.0.0.1.
    status, answer = request(page_server, "GET", "/", host=host.format(port=page_server))
    assert status == 403


def test_localhost_and_the_loopback_address_are_accepted(page_server):
    for name in ("localhost", "127.0.0.1", "LOCALHOST"):
        host = f"{name}:{page_server}"
        assert request(page_server, "GET", "/model", host=host)[0] == 200, host


def test_the_host_rules_for_a_server_shared_on_the_network():
    allowed = digit_server.host_allowed
    assert allowed("192.168.1.5:8000", "0.0.0.0", 8000)  # an address of this machine
    me = socket.gethostname().lower().removesuffix(".local")
    assert allowed(f"{me}:8000", "0.0.0.0", 8000) and allowed(f"{me}.local:8000", "0.0.0.0", 8000)
    assert not allowed(f"{me}.evil.example:8000", "0.0.0.0", 8000)
    assert allowed("[fe80::1]:8000", "0.0.0.0", 8000)
    assert not allowed("rebind.example:8000", "0.0.0.0", 8000)  # a name: refused
    assert allowed("192.168.1.5:8000", "192.168.1.5", 8000)
    assert not allowed("10.0.0.1:8000", "192.168.1.5", 8000)
    assert allowed("localhost", "127.0.0.1", 80) and not allowed("localhost", "127.0.0.1", 81)


def test_a_bug_while_classifying_gets_500_with_one_line_and_the_server_goes_on(
        page_server, monkeypatch, capfd):
    def broken(gray):
        raise RuntimeError("kthvalue(): selected number k out of range")

    monkeypatch.setattr(digit_cleanup, "preprocess", broken)
    status, answer = request(page_server, "POST", "/predict", drawn(5))
    assert status == 500 and answer["error"].startswith("unexpected RuntimeError")
    assert "RuntimeError while classifying a picture: kthvalue()" in capfd.readouterr().err
    monkeypatch.undo()
    assert request(page_server, "POST", "/predict", drawn(5))[0] == 200


def test_20_concurrent_requests_all_succeed(page_server):
    pictures = [drawn(d % 10) for d in range(20)]
    with ThreadPoolExecutor(20) as pool:
        answers = list(pool.map(lambda p: request(page_server, "POST", "/predict", p), pictures))
    assert [status for status, _ in answers] == [200] * 20
    ## each answer is its own picture's: the same picture again gives the same answer
    assert request(page_server, "POST", "/predict", pictures[7])[1] == answers[7][1]


def test_a_port_in_use_is_one_line_and_exit_code_2(trained_checkpoint, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert predict.main(["--serve", "--port", str(port), "--checkpoint",
                             str(trained_checkpoint)]) == 2
    err = capsys.readouterr().err
    assert err == (f"error: port {port} on 127.0.0.1 is already in use (by another program, or "
                   f"this page): pass --port {port + 1}\n")


def test_a_missing_checkpoint_is_reported_before_anything_is_served(tmp_path, capsys):
    assert predict.main(["--serve", "--port", "0", "--checkpoint", str(tmp_path / "no.pt")]) == 1
    captured = capsys.readouterr()
    assert "Open http" not in captured.out and "does not exist" in captured.err


def test_no_pictures_and_no_serve_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_:
        predict.main([])
    assert exit_.value.code == 2
    assert "give one or more pictures, or --serve to draw on a page" in capsys.readouterr().err


def test_pictures_given_with_serve_are_a_usage_error_not_ignored(capsys):
    with pytest.raises(SystemExit) as exit_:
        predict.main(["--serve", "samples/drawing_7.png"])
    assert exit_.value.code == 2
    assert "(it takes no pictures, --json" in capsys.readouterr().err


@pytest.mark.parametrize("flag", [["--json"], ["--save-input", "seen"], ["--top-k", "3"]])
def test_command_line_output_flags_with_serve_are_a_usage_error_not_ignored(capsys, tmp_path,
                                                                            flag):
    with pytest.raises(SystemExit) as exit_:
        predict.main(["--serve", *[str(tmp_path / f) if f == "seen" else f for f in flag]])
    assert exit_.value.code == 2
    assert "(it takes no pictures, --json, --save-input or --top-k" in capsys.readouterr().err
    assert not (tmp_path / "seen").exists()  # no folder made for nothing


## predict.py --serve, with a clean-up slowed down to 1 s of torch work that says when it starts.
SLOW_CLEAN_UP = """
import runpy, sys, time
import torch
from plumbing import digit_cleanup
real = digit_cleanup.preprocess
def slow(gray):
    print("classifying", flush=True)
    x, end = torch.ones(300, 300), time.monotonic() + 1
    while time.monotonic() < end:
        x = (x @ x).clamp(max=1)
    return real(gray)
digit_cleanup.preprocess = slow
sys.argv = ["predict.py", "--serve", "--port", "0", "--checkpoint", sys.argv[1]]
runpy.run_path("predict.py", run_name="__main__")
"""


def test_serve_prints_the_address_and_ctrl_c_while_classifying_ends_it_with_one_line(
        trained_checkpoint):
    ## First a client hangs up before its answer (a reload): that is no error, prints nothing,
    ## and the server goes on. Then Ctrl-C while a picture is classified. Python stops a
    ## request's thread at exit wherever it is; stopped inside torch's C++ code, it aborted the
    ## process ("terminate called without an active exception", code -6). `kill` (SIGTERM) goes
    ## through the same handler, tested with mnist_train.py.
    proc = start([sys.executable, "-u", "-c", SLOW_CLEAN_UP, str(trained_checkpoint)], cwd=REPO,
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = proc.stdout.readline()
    assert first.startswith("Open http://127.0.0.1:") and first.strip().endswith("Ctrl-C to stop.")
    port = int(first.split(":")[2].split("/")[0])
    hang_up_mid_request(port, drawn(4))
    assert proc.stdout.readline().strip() == "classifying"
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(request, port, "POST", "/predict", drawn(2))
        assert proc.stdout.readline().strip() == "classifying"  # once the hung-up one is done
        press_ctrl_c(proc)
        _, err = proc.communicate(timeout=60)
        assert (proc.returncode, err.strip()) == (130, "interrupted: stopped.")
        answer.exception(timeout=60)  # answered or cut off: either is fine for the page


def test_the_page_can_be_served_on_ipv6s_loopback_too():
    try:
        server = digit_server.make_server("::1", 0, lambda body: {"prediction": 7}, {})
    except OSError as err:  # a machine without IPv6
        pytest.skip(f"no IPv6 loopback here: {err}")
    port = server.server_port
    threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True).start()  # see serving
    try:
        connection = http.client.HTTPConnection("::1", port, timeout=60)
        connection.request("POST", "/predict", body=b"a picture",
                           headers={"Host": f"[::1]:{port}"})  # as a browser names it
        response = connection.getresponse()
        assert (response.status, json.loads(response.read())) == (200, {"prediction": 7})
        connection.close()
    finally:
        server.shutdown()
        server.server_close()


def test_a_server_on_every_ipv6_address_shows_ipv6s_loopback(capsys):
    ## --host :: listens on an IPv6 socket, which on Windows takes no IPv4 connections: the
    ## address printed must be [::1], not 127.0.0.1, and it must answer.
    try:
        server = digit_server.make_server("::", 0, lambda body: {}, {"model": "mlp"})
    except OSError as err:  # a machine without IPv6
        pytest.skip(f"no IPv6 here: {err}")
    port = server.server_port
    with ThreadPoolExecutor(1) as pool:
        serving = pool.submit(digit_server.serve, server, "::")
        connection = http.client.HTTPConnection("::1", port, timeout=60)
        connection.request("GET", "/model", headers={"Host": f"[::1]:{port}"})
        status = connection.getresponse().status
        connection.close()
        server.shutdown()
        serving.result(timeout=60)
    assert status == 200
    out = capsys.readouterr().out
    assert out.startswith(f"Open http://[::1]:{port}/ in a browser")
    assert "note: listening on every address of this machine: other machines" in out


def raw_reply(port: int, head: str) -> str:
    """Send a request's head (and body, if any) as it is; the whole reply."""
    connection = socket.create_connection(("127.0.0.1", port), timeout=30)
    connection.sendall(head.encode())
    reply = b""
    while chunk := connection.recv(4096):
        reply += chunk
    connection.close()
    return reply.decode()


# slow clients ------------------------------------------------------------------------------------
@contextmanager
def serving(answer=lambda body: {"ok": True}, **limits):
    """A server of its own on a free port, its Handler's deadlines set to `limits`: the server."""
    server = digit_server.make_server("127.0.0.1", 0, answer, {})
    for name, value in limits.items():  # header_seconds, body_seconds, body_rate
        setattr(server.RequestHandlerClass, name, value)
    ## Polled every 20 ms for shutdown(), not every 0.5 s: each test then ends at once.
    threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def wait_until(condition, what: str) -> None:
    """Wait for condition() to be true; fail after a minute (a hang, not a slow machine)."""
    give_up = time.monotonic() + 60
    while not condition():
        assert time.monotonic() < give_up, f"still not {what} after 60 s"
        time.sleep(0.01)


def stalled(port: int, sent: bytes) -> socket.socket:
    """A connection that sends `sent` and then nothing: a stalled (or malicious) client."""
    connection = socket.create_connection(("127.0.0.1", port), timeout=30)
    connection.sendall(sent)
    return connection


def still_open(connection: socket.socket) -> bool:
    """Whether the server has neither answered nor closed this connection yet."""
    connection.settimeout(0)  # a look at what has arrived, without waiting
    try:
        connection.recv(1, socket.MSG_PEEK)  # b"": closed; a byte: an answer. Either way...
        return False  # ...no longer open
    except BlockingIOError:  # nothing yet, and no end of the stream: still open
        return True
    except OSError:  # reset
        return False
    finally:
        connection.settimeout(30)


def trickle(connection: socket.socket) -> int:
    """Send a byte every 20 ms while the server keeps the connection open, for 30 s at most:
    the bytes sent. A socket timeout for each read would let it go on for ever."""
    sent = 0
    try:
        while sent < 1500 and still_open(connection):
            connection.sendall(b"a")
            sent += 1
            time.sleep(0.02)
    except ConnectionError:  # reset: closed by the server with a byte it had not read
        pass
    return sent


def post_head(port: int, length: int) -> bytes:
    return (f"POST /predict HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Content-Length: {length}\r\n\r\n").encode()


def test_a_picture_is_answered_while_60_uploads_and_60_requests_stall_and_after(
        trained_checkpoint):
    ## The deadlines are long here, so that every stalled client is sure to be still stalled
    ## when the picture's answer comes: what it needed must not be held by them.
    model, checkpoint = files.load_model(trained_checkpoint)
    classify = partial(predict.read_and_classify, model=model, checkpoint=checkpoint, device="cpu")
    with serving(digit_server.page_answer(classify), header_seconds=600,
                 body_seconds=600) as server:
        port = server.server_port
        uploads = [stalled(port, post_head(port, 100_000) + b"abc") for _ in range(60)]
        requests = [stalled(port, post_head(port, 100_000)[:30]) for _ in range(60)]
        wait_until(lambda: server.held == 60 * 3, "reading the 60 bodies")  # their 3 bytes each
        ## A timeout on the socket, not a measured time: a page that waits fails here.
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        connection.request("POST", "/predict", body=drawn(3))
        assert connection.getresponse().status == 200
        connection.close()
        assert all(still_open(c) for c in uploads + requests)  # answered while they stalled
        for connection in uploads + requests:
            connection.close()
        wait_until(lambda: server.held == 0, "giving back the stalled bodies' memory")
        assert request(port, "POST", "/predict", drawn(3))[0] == 200


def in_use(server) -> None:
    """Give the test server its deadlines in use again, for a request that must pass."""
    for name in ("header_seconds", "body_seconds", "body_rate"):
        setattr(server.RequestHandlerClass, name, getattr(digit_server.make_server(
            "127.0.0.1", 0, None, {}).RequestHandlerClass, name))


def test_a_client_that_sends_no_headers_is_cut_off():
    with serving(header_seconds=0.2) as server:  # 10 s in use
        connection = stalled(server.server_port, b"GET / HTTP/1.1\r\n")  # and nothing more
        assert connection.recv(1) == b""  # closed without an answer, within the 30 s
        connection.close()
        in_use(server)
        assert request(server.server_port, "GET", "/model")[0] == 200


def test_a_client_that_trickles_its_headers_is_cut_off_at_the_deadline():
    ## A header that never ends, a byte every 20 ms: each read gets a byte in time, but the
    ## headers as a whole have a deadline (0.2 s here).
    with serving(header_seconds=0.2) as server:
        connection = stalled(server.server_port, b"GET / HTTP/1.1\r\nX-Slow: ")
        assert trickle(connection) < 1500  # cut off before the 30 s
        connection.close()
        in_use(server)
        assert request(server.server_port, "GET", "/model")[0] == 200


def test_a_body_that_stalls_gets_408_and_its_memory_back():
    ## 40,000 bytes at once, then nothing: at the 1 KB/s asked for here (50 KB/s in use) they
    ## would buy 40 s, but a stall is cut off after 0.2 s (10 s in use) all the same.
    with serving(body_seconds=0.2, body_rate=1000) as server:
        port = server.server_port
        connection = stalled(port, post_head(port, 100_000) + bytes(40_000))
        reply = b""
        while chunk := connection.recv(4096):  # within the 30 s; closed after its reply
            reply += chunk
        connection.close()
        head, _, body = reply.partition(b"\r\n\r\n")
        assert head.split()[1] == b"408" and json.loads(body) == {
            "error": "the picture stopped coming or came too slowly: this server waits 0.2 s at "
                     "most, and needs 1 KB/s on average"}
        wait_until(lambda: server.held == 0, "giving back the body's memory")
        in_use(server)
        assert request(port, "POST", "/predict", b"a picture")[0] == 200


def test_a_body_that_trickles_is_cut_off_and_its_memory_given_back():
    ## 50 bytes/s, under the 1,000 asked for here after the first 0.2 s. A deadline that each
    ## byte put off, as a socket's timeout, would never end it.
    with serving(body_seconds=0.2, body_rate=1000) as server:
        port = server.server_port
        connection = stalled(port, post_head(port, 100_000) + b"abc")
        assert trickle(connection) < 1500  # cut off (with a 408) before the 30 s
        connection.close()
        wait_until(lambda: server.held == 0, "giving back the body's memory")
        in_use(server)
        assert request(port, "POST", "/predict", b"a picture")[0] == 200


def test_pictures_over_the_memory_for_uploads_get_503_until_it_is_given_back(monkeypatch):
    ## 1000 bytes for all the pictures in memory (20 MB x 4 in use): one upload has sent 800 of
    ## its 900 bytes, so another of 500 bytes would be over.
    monkeypatch.setattr(digit_server, "BODIES_HELD", 1000)
    ## A long deadline for bodies (10 s in use): on a busy machine the first upload's stall
    ## must not be cut off before the requests that need its 800 bytes held.
    with serving(body_seconds=600) as server:
        port = server.server_port
        first = stalled(port, post_head(port, 900) + bytes(800))
        wait_until(lambda: server.held == 800, "holding the first upload's 800 bytes")
        assert request(port, "POST", "/predict", bytes(500)) == (503, {
            "error": "the server is receiving too many pictures at once: try again"})
        assert request(port, "POST", "/predict", bytes(100))[0] == 200  # within the 1000
        first.close()  # cut off: its 800 bytes are given back
        wait_until(lambda: server.held == 0, "giving back the first upload's memory")
        assert request(port, "POST", "/predict", bytes(500))[0] == 200


@pytest.mark.parametrize("headers, status, error", [
    ("Transfer-Encoding: chunked", "411", "send the picture with a Content-Length, not chunked"),
    ("Content-Length: 3\r\nContent-Length: 5", "400", "more than one Content-Length"),
])
def test_a_body_of_unclear_length_is_refused(page_server, headers, status, error):
    reply = raw_reply(page_server, f"POST /predict HTTP/1.1\r\nHost: 127.0.0.1:{page_server}"
                      f"\r\n{headers}\r\n\r\n")
    assert reply.split()[1] == status and json.loads(reply.partition("\r\n\r\n")[2]) == {
        "error": error}
    assert request(page_server, "POST", "/predict", drawn(3))[0] == 200


def test_headers_over_the_limit_get_431_without_waiting_for_more():
    ## Exactly the limit of header bytes, and no blank line to end them: http.server alone would
    ## wait for more (up to 100 lines of 64 KB) until the 10 s deadline, then answer nothing.
    ## The server reads every byte sent, so its close cannot reset the connection (a reset can
    ## lose the answer before it is read).
    with serving() as server:
        port, limit = server.server_port, server.RequestHandlerClass.header_bytes
        head = f"GET /model HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        lines, left = [], limit - len(head)
        while left:
            size = left if left < 60_000 else 50_000  # each line under http.server's 64 KB
            prefix = f"X-Big-{len(lines)}: "
            lines.append(prefix + "a" * (size - len(prefix) - 2) + "\r\n")
            left -= size
        sent = (head + "".join(lines)).encode()
        assert len(sent) == limit
        connection = socket.create_connection(("127.0.0.1", port), timeout=30)
        connection.sendall(sent)
        reply = b""
        while chunk := connection.recv(4096):
            reply += chunk
        connection.close()
        assert reply.startswith(b"HTTP/1.0 431 "), reply[:80]
        assert b"over the server's limit" in reply
        ## A browser's few KB of headers still pass.
        assert request(port, "GET", "/model", headers={"Cookie": "x" * 8000})[0] == 200
