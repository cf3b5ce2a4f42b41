"""Plain helper functions that several test modules use (the fixtures are in conftest.py)."""

import csv
import signal
import struct
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import torch
from PIL import Image, ImageDraw, ImageFont


def read_csv(path):
    """The rows of a CSV file with a header, as dicts."""
    with open(path) as f:
        return list(csv.DictReader(f))


def change_a_tensor_on_disk(path, where="data") -> None:
    """Flip one byte of a tensor's data in a torch.save file, as a bad copy or a failing disk
    might: the file still loads, with one wrong weight. Or ("header") one bit of the length
    of the name in front of that data: it still loads, with every weight shifted by a byte."""
    with zipfile.ZipFile(path) as archive:
        part = next(p for p in archive.infolist() if "/data/" in p.filename and p.file_size)
    data = bytearray(path.read_bytes())
    header = part.header_offset  # a local header: 30 bytes, then its name and extra field
    name_length, extra_length = struct.unpack("<HH", data[header + 26:header + 30])
    if where == "header":
        data[header + 26] ^= 0x01
    else:
        data[header + 30 + name_length + extra_length] ^= 0xFF
    path.write_bytes(bytes(data))


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


def save_checkpoint(path, model, **about) -> None:
    """A checkpoint as mnist_train.py saves one: the weights, with what rebuilds and uses them
    (model_name, mean, std, and here any other keys given)."""
    torch.save({"state_dict": model.state_dict(), **about}, path)


def standardised(images, mean, std):
    """uint8 pictures [N, 28, 28] as mnist_train.py standardises them: float32 [N, 1, 28, 28]."""
    return images.unsqueeze(1).float().div(255).sub(mean).div(std)


## A run of mnist_train.py that holds its save path until the test lets it go on: its first
## epoch waits for the file `go`, after saying so with the file `started`. With `windows`, it
## locks files as Windows does (msvcrt's byte ranges, emulated with POSIX lockf), as if Python
## had no fcntl.
WAITING_RUN = """
import os, runpy, subprocess, sys, time, types
from pathlib import Path
started, go, windows = Path(sys.argv.pop(1)), Path(sys.argv.pop(1)), sys.argv.pop(1) == "1"
if windows:
    import fcntl
    msvcrt = types.ModuleType("msvcrt")
    msvcrt.LK_NBLCK, msvcrt.LK_UNLCK = 2, 0
    def locking(fd, mode, nbytes):  # from the file's position, as Windows' _locking
        start = os.lseek(fd, 0, os.SEEK_CUR)
        try:
            fcntl.lockf(fd, fcntl.LOCK_UN if mode == msvcrt.LK_UNLCK else
                        fcntl.LOCK_EX | fcntl.LOCK_NB, nbytes, start)
        except BlockingIOError:
            raise PermissionError(13, "Permission denied") from None
    msvcrt.locking = locking
    sys.modules["msvcrt"], sys.modules["fcntl"] = msvcrt, None  # import fcntl: ImportError
sys.path.insert(0, os.getcwd())
import common
real = common.train_one_epoch
def waiting(*args, **kwargs):
    started.touch()
    while not go.exists():
        time.sleep(0.02)
    return real(*args, **kwargs)
common.train_one_epoch = waiting
sys.argv[0] = "mnist_train.py"
runpy.run_path("mnist_train.py", run_name="__main__")
"""


def start_waiting_run(folder, argv, windows=False, torchrun=0, expect_start=True):
    """Start WAITING_RUN with mnist_train.py's `argv` (under torchrun with that many processes)
    and wait for its first epoch, if `expect_start`: (the process, its `started` file, its `go`
    file). Its output is in folder/out.txt."""
    repo = Path(__file__).resolve().parent.parent
    folder.mkdir(parents=True, exist_ok=True)
    script, started, go = folder / "waiting_run.py", folder / "started", folder / "go"
    script.write_text(WAITING_RUN)
    launcher = ([sys.executable, "-m", "torch.distributed.run", "--standalone",
                 f"--nproc_per_node={torchrun}"] if torchrun else [sys.executable])
    out = open(folder / "out.txt", "w")
    proc = subprocess.Popen([*launcher, str(script), str(started), str(go), str(int(windows)),
                             *argv], cwd=repo, stdout=out, stderr=subprocess.STDOUT, text=True)
    give_up = time.monotonic() + 120
    while expect_start and not started.exists():
        assert proc.poll() is None, (folder / "out.txt").read_text()[-3000:]
        assert time.monotonic() < give_up, "the waiting run never started its first epoch"
        time.sleep(0.05)
    return proc, started, go
