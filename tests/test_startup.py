"""Start at the speed of `import torch`: no script pays for torchvision it does not use."""

import ast
import errno
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import digit_picture

REPO = Path(__file__).resolve().parent.parent

## torchvision's import costs seconds (its models and ops pull in PyTorch's compiler), and a
## run with MNIST on disk needs none of it. One process runs each script's real work in turn,
## and reports after each whether any torchvision module was imported.
## Each script also freezes the objects that live until exit (gc.freeze: a faster exit, and
## full collections that skip them); gc.unfreeze() before each run tells the runs apart.
WHOLE_RUNS = """
import gc, sys
def torchvision_imported():
    return any(m.startswith("torchvision") for m in sys.modules)
def frozen():
    return gc.get_freeze_count() > 100_000
import mnist_train, predict, synthetic_train
print("import", torchvision_imported(), frozen(), gc.isenabled())
rc = mnist_train.main(["--data-dir", DATA, "--val-size", "200", "--epochs", "1",
                       "--save-path", OUT + "/m.pt"])
print("mnist_train", rc, torchvision_imported(), frozen())
gc.unfreeze()
rc = predict.main(["--checkpoint", OUT + "/m.pt", OUT + "/three.png"])
print("predict", rc, torchvision_imported(), frozen())
gc.unfreeze()
sys.argv = ["synthetic_train.py", "--epochs", "1", "--samples", "256"]
synthetic_train.main()
print("synthetic_train", torchvision_imported(), frozen())
"""


def test_the_scripts_import_no_torchvision_and_freeze_what_lives_until_exit(tiny_mnist, tmp_path):
    digit_picture(3).save(tmp_path / "three.png")
    code = f"DATA, OUT = {str(tiny_mnist)!r}, {str(tmp_path)!r}\n" + WHOLE_RUNS
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=600)
    reports = [line for line in proc.stdout.splitlines()
               if line.split()[0] in ("import", "mnist_train", "predict", "synthetic_train")]
    ## Imported rather than run (a notebook, the tests), a script leaves the collector alone.
    assert reports == ["import False False True", "mnist_train 0 False True",
                       "predict 0 False True", "synthetic_train False True"], proc.stderr[-2000:]
    assert (tmp_path / "m_mistakes.png").exists()  # the mistakes picture was drawn, by Pillow


## Run as a script, each pauses the cycle collector for its `import torch` (without the pause,
## that import alone makes several full collections, each over everything loaded so far), and
## once the imports are in, freezes them and switches it back on. `--help` stops each right
## there. The collector's state is noted as each script's own `import torch` statement runs
## (torch is loaded beforehand: watching every import of torch's own would take seconds).
PAUSED_WHILE_TORCH_LOADS = """
import builtins, gc, sys
import torch
calls, collecting_at_import = [], []
def recorded(name, real):
    def call():
        calls.append(name)
        real()
    return call
for name in ["disable", "freeze", "enable"]:
    setattr(gc, name, recorded(name, getattr(gc, name)))
real_import = builtins.__import__
def noting_import(name, globals=None, *args):
    if name == "torch" and globals is namespace and not collecting_at_import:
        collecting_at_import.append(gc.isenabled())
    return real_import(name, globals, *args)
builtins.__import__ = noting_import
for script in ["mnist_train.py", "predict.py", "synthetic_train.py"]:
    code = compile(open(script, encoding="utf-8").read(), script, "exec")
    sys.argv, namespace = [script, "--help"], {"__name__": "__main__", "__file__": script}
    calls.clear(), collecting_at_import.clear()
    try:
        exec(code, namespace)
    except SystemExit:
        pass
    print(script, collecting_at_import, calls, gc.isenabled(), gc.get_freeze_count() > 100_000)
"""


def test_run_as_a_script_each_pauses_the_collector_while_torch_loads():
    proc = subprocess.run([sys.executable, "-c", PAUSED_WHILE_TORCH_LOADS], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    reports = [line for line in proc.stdout.splitlines() if line.endswith(("True", "False"))]
    seen = "[False] ['disable', 'freeze', 'enable'] True True"
    assert reports == [f"mnist_train.py {seen}", f"predict.py {seen}",
                       f"synthetic_train.py {seen}"], proc.stderr[-2000:]


@pytest.mark.skipif(sys.platform == "win32", reason="os.kill(SIGINT) is not Ctrl-C on Windows")
@pytest.mark.parametrize("script", ["mnist_train.py", "predict.py", "synthetic_train.py"])
def test_ctrl_c_while_torch_loads_is_one_line_and_exit_code_130(tmp_path, script):
    ## A stand-in torch that presses Ctrl-C on itself as it is imported: the moment a real
    ## Ctrl-C lands in the first second or two of every run.
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text(
        "import os, signal, time\nos.kill(os.getpid(), signal.SIGINT)\ntime.sleep(60)\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    result = subprocess.run([sys.executable, script], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 130
    assert result.stderr == "\ninterrupted: stopped while starting up.\n"


## Each script, with what it says on stderr when the reader of its output is gone.
CLOSED_OUTPUT_RUNS = [
    ("predict.py", ["--checkpoint", "CKPT", "PIC"], ""),
    ("mnist_train.py", ["--data-dir", "DATA", "--epochs", "1", "--val-size", "200",
                        "--save-path", "OUT/m.pt"],
     "stopped: the program reading the output closed it. This run saved nothing yet.\n"),
    ("synthetic_train.py", ["--epochs", "1", "--samples", "256"],
     "stopped: the program reading the output closed it.\n"),
]


def closed_output_names(trained_checkpoint, tiny_mnist, tmp_path) -> dict[str, str]:
    digit_picture(3).save(tmp_path / "three.png")
    return {"CKPT": str(trained_checkpoint), "PIC": str(tmp_path / "three.png"),
            "DATA": str(tiny_mnist), "OUT/m.pt": str(tmp_path / "m.pt")}


@pytest.mark.skipif(sys.platform == "win32", reason="a pipe closed by its reader is POSIX's")
@pytest.mark.parametrize("script, args, note", CLOSED_OUTPUT_RUNS)
def test_output_into_a_reader_that_stops_reading_ends_without_a_traceback(
        trained_checkpoint, tiny_mnist, tmp_path, script, args, note):
    ## `python predict.py *.png | head -1`: head exits once it has its line. Here the pipe's
    ## reading end is closed before the script starts, so its very first print finds it closed.
    names = closed_output_names(trained_checkpoint, tiny_mnist, tmp_path)
    read_end, write_end = os.pipe()
    os.close(read_end)
    ## Each print written at once: the first one stops the script, which says so. Or all of
    ## them at exit: the script has done its work by then, and only the output is lost.
    for unbuffered, said in (("1", note), ("", "")):
        env = {**os.environ, "PYTHONUNBUFFERED": unbuffered}
        result = subprocess.run([sys.executable, script, *[names.get(a, a) for a in args]],
                                cwd=REPO, env=env, stdout=write_end, stderr=subprocess.PIPE,
                                text=True, timeout=300)
        assert (result.returncode, result.stderr) == (1, said)
    os.close(write_end)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs Linux's /dev/full")
@pytest.mark.parametrize("script, args, note", CLOSED_OUTPUT_RUNS)
def test_output_onto_a_full_disk_ends_with_one_line_not_a_traceback(
        trained_checkpoint, tiny_mnist, tmp_path, script, args, note):
    ## `python mnist_train.py > log.txt` on a full disk: /dev/full fails every write that way.
    names = closed_output_names(trained_checkpoint, tiny_mnist, tmp_path)
    with open("/dev/full", "w") as full:
        result = subprocess.run([sys.executable, script, *[names.get(a, a) for a in args]],
                                cwd=REPO, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                                stdout=full, stderr=subprocess.PIPE, text=True, timeout=300)
    why = "the output could not be written (No space left on device)"
    said = (note.replace("the program reading the output closed it", why) if note else
            f"error: {why}.\n")  # predict.py is quiet about a closed pipe, not about this
    assert (result.returncode, result.stderr) == (1, said)


def test_a_full_disk_at_the_last_flush_is_one_line_and_code_1(monkeypatch, capsys):
    import common
    class FullDisk(io.StringIO):
        def flush(self):
            raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(sys, "stdout", FullDisk())
    assert common.flush_output(0) == 1
    assert capsys.readouterr().err == ("error: the output could not be written (No space left "
                                       "on device).\n")


## On Windows, a write into a pipe whose reader is gone can fail with OSError EINVAL rather than
## BrokenPipeError (CPython issue #79935). Emulated here, in one process: torch and Pillow load
## first, as on any machine; then the platform is set to win32, and each run's stdout fails as
## Windows' does, until the script points it at the null device.
WINDOWS_CLOSED_PIPE = """
import errno, io, os, runpy, stat, sys
import torch, PIL.Image
pipe = os.dup(1)
class WindowsClosedPipe:
    def __init__(self, fails):
        self.fails = fails
    def fail(self):
        if stat.S_ISFIFO(os.fstat(1).st_mode):  # not yet pointed at the null device
            raise OSError(errno.EINVAL, "Invalid argument")
    def write(self, text):
        if self.fails == "write":
            self.fail()
        return len(text)
    def flush(self):
        self.fail()
    def fileno(self):
        return 1
sys.platform = "win32"
for fails, argv in RUNS:
    os.dup2(pipe, 1)
    sys.stdout, sys.stderr, sys.argv = WindowsClosedPipe(fails), io.StringIO(), argv
    try:
        runpy.run_path(argv[0], run_name="__main__")
        code = 0
    except SystemExit as exit:
        code = exit.code
    said, sys.stderr = sys.stderr.getvalue(), sys.__stderr__
    print("run", repr((argv[0], fails, code, said)), file=sys.stderr)
sys.stdout = sys.__stdout__
"""


def test_a_closed_output_as_windows_reports_it_ends_without_a_traceback(
        trained_checkpoint, tiny_mnist, tmp_path):
    names = closed_output_names(trained_checkpoint, tiny_mnist, tmp_path)
    ## Each print failing, as unbuffered; or only the last flush, as at the end of a buffered
    ## run: the work is done, and only the output is lost.
    runs = [(fails, [script, *[names.get(a, a) for a in args]])
            for fails in ("write", "flush") for script, args, _ in CLOSED_OUTPUT_RUNS]
    code = f"RUNS = {runs!r}\n" + WINDOWS_CLOSED_PIPE
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                            text=True, timeout=300)
    reports = [ast.literal_eval(line[4:]) for line in result.stderr.splitlines()
               if line.startswith("run (")]
    assert reports == [(script, fails, 1, note if fails == "write" else "")
                       for fails in ("write", "flush")
                       for script, _, note in CLOSED_OUTPUT_RUNS], result.stderr[-2000:]


def test_only_a_closed_output_is_taken_for_one(monkeypatch):
    import common
    einval = OSError(errno.EINVAL, "Invalid argument")
    monkeypatch.setattr(sys, "platform", "linux")
    assert common.is_closed_output(BrokenPipeError(errno.EPIPE, "Broken pipe"))
    assert not common.is_closed_output(einval)  # on Linux, EINVAL is something else
    monkeypatch.setattr(sys, "platform", "win32")
    assert common.is_closed_output(einval)
    assert not common.is_closed_output(OSError(errno.EINVAL, "Invalid argument", "a:b.pt"))
    windows_error = OSError(errno.EINVAL, "The paging file is too small")
    windows_error.winerror = 1455  # Python's EINVAL for a Windows error it has no errno for
    assert not common.is_closed_output(windows_error)
    assert not common.is_closed_output(OSError(errno.ENOSPC, "No space left on device"))
    ## A full disk is not a closed pipe, but it is stdout's failure when no file is named.
    assert common.output_failure(OSError(errno.ENOSPC, "No space left on device")) == (
        "the output could not be written (No space left on device)")
    assert common.output_failure(OSError(errno.ENOSPC, "No space left", "ck.pt")) is None
    assert common.output_failure(OSError(errno.EACCES, "Permission denied")) is None
