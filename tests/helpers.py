"""Plain helper functions that several test modules use (the fixtures are in conftest.py)."""

import csv
import signal
import subprocess
import sys

import pytest
import torch
from PIL import Image, ImageDraw, ImageFont


def read_csv(path):
    """The rows of a CSV file with a header, as dicts."""
    with open(path) as f:
        return list(csv.DictReader(f))


def printed_confusion_matrix(out: str) -> torch.Tensor:
    """The 10 x 10 counts of the table that follows the "confusion matrix" heading."""
    lines = out[out.index("confusion matrix"):].splitlines()[2:12]
    return torch.tensor([[int(v) for v in line.split("|")[1].split()] for line in lines])


def digit_picture(digit: int, size=(300, 220), ink=(25, 35, 110), paper=(238, 232, 220),
                  font_size=150, centre=(150, 110)) -> Image.Image:
    """A photo-like picture: a dark digit on light paper, not centred, much bigger than 28x28."""
    img = Image.new("RGB", size, paper)
    font = ImageFont.load_default(size=font_size)
    ImageDraw.Draw(img).text(centre, str(digit), fill=ink, font=font, anchor="mm")
    return img


## FIFOs, /proc and Unix permissions do not exist on Windows.
posix_only = pytest.mark.skipif(sys.platform == "win32", reason="needs POSIX files (FIFOs, "
                                "/proc, permission bits)")


def start(cmd, **kwargs) -> subprocess.Popen:
    """subprocess.Popen; on Windows in a process group of its own, for press_ctrl_c()."""
    if sys.platform == "win32":
        kwargs["creationflags"] = subprocess.CREATE_NEW_PROCESS_GROUP
    return subprocess.Popen(cmd, **kwargs)


def press_ctrl_c(proc: subprocess.Popen) -> None:
    """What Ctrl-C at a terminal does, for that process only: SIGINT; on Windows, Ctrl-Break."""
    ## Windows cannot aim Ctrl-C at one process (CTRL_C_EVENT reaches the whole console, this
    ## test runner too), and send_signal(SIGINT) raises ValueError there. CTRL_BREAK_EVENT can
    ## be aimed at a process group, and the scripts treat it exactly like Ctrl-C.
    proc.send_signal(signal.CTRL_BREAK_EVENT if sys.platform == "win32" else signal.SIGINT)
