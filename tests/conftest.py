"""Shared test fixtures: a tiny MNIST written in the real IDX format, and digit images.

No test downloads anything. The tiny MNIST below is 1,000 digits drawn with Pillow's
built-in font, varied in size, position, stroke and angle, and saved as the four IDX files that
torchvision reads, so mnist_train.py runs its real loading code on it.
"""

import os
import random
import shutil
import signal
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image, ImageDraw, ImageFont

TINY_TRAIN, TINY_TEST = 800, 200

## The tests work on about a thousand 28x28 images: batches far too small for two threads to
## help, and on a busy 2-core machine the threads wait on each other (3-9x slower than one).
## Child processes that the tests start get the same setting through OMP_NUM_THREADS.
torch.set_num_threads(1)
os.environ.setdefault("OMP_NUM_THREADS", "1")

## The tests pin down what a CPU computes, and emulate a GPU where they need its answers. A real
## GPU is hidden from them and from the scripts they start, so that --device auto is the CPU.
os.environ["CUDA_VISIBLE_DEVICES"] = ""

## Started in the background by a shell without job control (`nohup python -m pytest &`),
## pytest inherits Ctrl-C (SIGINT) ignored, and so would every script the tests start: their
## Ctrl-C tests would fail or wait. With a handler of its own here (Python's usual one), the
## scripts it starts begin with SIGINT's default again, as at a terminal.
if sys.platform != "win32" and signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def render_digit(digit: int, rng: random.Random, size: int = 28) -> Image.Image:
    """A white-on-black digit drawn with Pillow's font, with random size, shift, width and tilt."""
    scale = size / 28
    font = ImageFont.load_default(size=round(rng.uniform(17, 24) * scale))
    img = Image.new("L", (size, size))
    centre = (size / 2 + rng.uniform(-2, 2) * scale, size / 2 + rng.uniform(-2, 2) * scale)
    ImageDraw.Draw(img).text(centre, str(digit), fill=255, font=font, anchor="mm",
                             stroke_width=rng.choice([0, 1]) * round(scale), stroke_fill=255)
    return img.rotate(rng.uniform(-12, 12), resample=Image.BILINEAR)


def write_idx(path: Path, data: torch.Tensor) -> None:
    """Write a uint8 tensor in the IDX format of the MNIST files."""
    header = bytes([0, 0, 0x08, data.dim()])  # zero, zero, type 0x08 = unsigned byte, ndims
    header += b"".join(d.to_bytes(4, "big") for d in data.shape)
    path.write_bytes(header + data.to(torch.uint8).numpy().tobytes())


def make_tiny_mnist(root: Path, n_train: int = TINY_TRAIN, n_test: int = TINY_TEST) -> Path:
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True)
    rng = random.Random(0)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        labels = torch.tensor([i % 10 for i in range(n)])
        images = torch.stack([torch.frombuffer(bytearray(render_digit(int(d), rng).tobytes()),
                                               dtype=torch.uint8).view(28, 28) for d in labels])
        write_idx(raw / f"{prefix}-images-idx3-ubyte", images)
        write_idx(raw / f"{prefix}-labels-idx1-ubyte", labels)
    return root


@pytest.fixture(scope="session")
def tiny_mnist(tmp_path_factory) -> Path:
    """A data dir holding MNIST/raw/ with 800 training and 200 test digits (read-only for tests)."""
    return make_tiny_mnist(tmp_path_factory.mktemp("tiny_mnist"))


@pytest.fixture
def tiny_mnist_copy(tiny_mnist, tmp_path) -> Path:
    """A fresh, writable copy of the tiny MNIST, for tests that damage it."""
    return Path(shutil.copytree(tiny_mnist, tmp_path / "data"))


@pytest.fixture
def no_network(monkeypatch):
    """Point torchvision's MNIST mirrors at a closed local port: downloads fail at once."""
    from torchvision import datasets

    monkeypatch.setattr(datasets.MNIST, "mirrors", ["http://127.0.0.1:9/"])


@pytest.fixture(scope="session")
def trained_checkpoint(tiny_mnist, tmp_path_factory) -> Path:
    """An MLP checkpoint trained by mnist_train.py on the tiny MNIST (session-wide, read-only)."""
    import mnist_train

    path = tmp_path_factory.mktemp("trained") / "mnist_mlp.pt"
    args = ["--data-dir", str(tiny_mnist), "--save-path", str(path), "--val-size", "100",
            "--epochs", "25", "--lr", "2e-3", "--log-interval", "1000"]
    assert mnist_train.main(args) == 0
    return path


@pytest.fixture
def small_disk(tmp_path):
    """make(size) -> a folder on a new tmpfs of `size` bytes: a real disk that fills up.

    Mounting needs root (and, in a container, the right to mount); without it the test is
    skipped with the reason.
    """
    import subprocess

    mounted = []

    def make(size: int) -> Path:
        if not hasattr(os, "geteuid") or os.geteuid() != 0:
            pytest.skip("a real full disk needs a small tmpfs, and mounting one needs root")
        folder = tmp_path / f"disk{len(mounted)}"
        folder.mkdir()
        try:
            proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
                                   str(folder)], capture_output=True, text=True)
        except FileNotFoundError:
            pytest.skip("no `mount` command to make a small tmpfs")
        if proc.returncode != 0:
            pytest.skip(f"could not mount a small tmpfs here: {proc.stderr.strip()}")
        mounted.append(folder)
        return folder

    yield make
    for folder in mounted:
        subprocess.run(["umount", str(folder)], check=True)


@pytest.fixture(scope="session")
def page_server(trained_checkpoint):
    """The page's server, as `predict.py --serve` builds it, on a free port: its port."""
    import threading
    from functools import partial

    import predict
    from plumbing import digit_server, files

    model, checkpoint = files.load_model(trained_checkpoint)
    about = {"checkpoint": str(trained_checkpoint), "model": "mlp", "epoch": checkpoint["epoch"],
             "val_accuracy": checkpoint["val_accuracy"]}
    classify = partial(predict.read_and_classify, model=model, checkpoint=checkpoint, device="cpu")
    httpd = digit_server.make_server("127.0.0.1", 0, digit_server.page_answer(classify), about)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.02,), daemon=True)  # quick end
    thread.start()
    yield httpd.server_port
    httpd.shutdown()
    httpd.server_close()
