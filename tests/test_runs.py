"""plumbing/runs.py, runs.py and files.py: how the scripts end (Ctrl-C, a closed or full
output), their command lines, their output checks, and what they import."""

import errno
import gc
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import digit_picture

from plumbing import files, runs

REPO = Path(__file__).resolve().parent.parent


class Output(io.StringIO):
    """A stdout whose writes or flush fail with `error`, as a closed pipe or a full disk does."""

    def __init__(self, error, on="write"):
        super().__init__()
        self.error, self.on = error, on

    def write(self, text):
        if self.on == "write":
            raise self.error
        return len(text)

    def flush(self):
        raise self.error

    def fileno(self):
        raise io.UnsupportedOperation  # nothing to point at the null device


def ended(main, monkeypatch, capsys, stdout=None) -> tuple[int, str]:
    """(exit code, stderr) of run_script(main), with `stdout` as sys.stdout."""
    if stdout is not None:
        monkeypatch.setattr(sys, "stdout", stdout)
    with pytest.raises(SystemExit) as exit_:
        try:
            runs.run_script(main)
        finally:
            gc.unfreeze()  # run_script froze the test run's objects
    return exit_.value.code, capsys.readouterr().err


def test_a_script_runs_with_its_imports_out_of_the_garbage_collectors_sight(monkeypatch, capsys):
    ## A speed measure (benchmarks/bench_pipeline.py --end-to-end shows it): the collector does
    ## not scan PyTorch's objects again at every collection and at exit.
    assert ended(lambda: 0 if gc.get_freeze_count() > 0 else 5, monkeypatch, capsys) == (0, "")


def test_a_script_ends_with_one_line_on_ctrl_c_and_its_own_code_otherwise(monkeypatch, capsys):
    def interrupted():
        raise KeyboardInterrupt

    assert ended(interrupted, monkeypatch, capsys) == (130, "\ninterrupted: stopped.\n")
    assert ended(lambda: 3, monkeypatch, capsys) == (3, "")
    monkeypatch.setattr(sys, "stdout", None)  # started with stdout closed (`>&-`)
    assert ended(lambda: 0, monkeypatch, capsys) == (0, "")


@pytest.mark.parametrize("platform, error, on, said", [
    ("linux", BrokenPipeError(errno.EPIPE, "Broken pipe"), "write", ""),  # `| head`: quietly
    ("linux", BrokenPipeError(errno.EPIPE, "Broken pipe"), "flush", ""),  # at the last flush
    ## On Windows a closed pipe can be OSError EINVAL (CPython issue #79935).
    ("win32", OSError(errno.EINVAL, "Invalid argument"), "write", ""),
    ("linux", OSError(errno.ENOSPC, "No space left on device"), "flush",
     "error: the output could not be written (No space left on device).\n"),
])
def test_a_closed_or_full_output_ends_a_script_with_code_1_and_no_traceback(
        monkeypatch, capsys, platform, error, on, said):
    monkeypatch.setattr(sys, "platform", platform)
    assert ended(lambda: print("a result") or 0, monkeypatch, capsys, Output(error, on)) == (
        1, said)


def raised_again(err: OSError) -> bool:
    """Whether stopped() takes `err` for no failure of stdout, and raises it again."""
    with pytest.raises(OSError) as raised:
        runs.stopped(err, "")
    return raised.value is err


def test_only_stdout_s_own_failures_are_taken_for_them(monkeypatch):
    einval = OSError(errno.EINVAL, "Invalid argument")
    monkeypatch.setattr(sys, "platform", "linux")
    assert raised_again(einval)  # on Linux, EINVAL is something else
    monkeypatch.setattr(sys, "platform", "win32")
    assert raised_again(OSError(errno.EINVAL, "Invalid argument", "a:b.pt"))
    windows_error = OSError(errno.EINVAL, "The paging file is too small")
    windows_error.winerror = 1455  # Python's EINVAL for a Windows error it has no errno for
    assert raised_again(windows_error)
    assert raised_again(OSError(errno.ENOSPC, "No space left", "ck.pt"))
    assert raised_again(OSError(errno.EACCES, "Permission denied"))
    with pytest.raises(PermissionError):  # anything else is a bug: its traceback shows
        runs.run_script(lambda: (_ for _ in ()).throw(PermissionError(13, "denied")))
    gc.unfreeze()


@pytest.mark.skipif(sys.platform == "win32", reason="a pipe closed by its reader is POSIX's")
def test_a_really_closed_output_ends_the_scripts_without_a_traceback(trained_checkpoint,
                                                                     tiny_mnist, tmp_path):
    ## `python predict.py *.png | head -1`: head exits once it has its line. Here the reading
    ## end is closed before the script starts. Buffered, the script's work is done and only
    ## the last flush, as Python exits, fails; unbuffered, its first print stops mnist_train.py,
    ## which says what is on disk. (A full disk fails the same flush: the test above.)
    digit_picture(3).save(tmp_path / "three.png")
    read_end, write_end = os.pipe()
    os.close(read_end)
    runs = [(["predict.py", "--checkpoint", str(trained_checkpoint), str(tmp_path / "three.png")],
             "", ""),
            (["mnist_train.py", "--data-dir", str(tiny_mnist), "--val-size", "200", "--epochs",
              "1", "--save-path", str(tmp_path / "m.pt")], "1",
             "stopped: the program reading the output closed it. This run saved nothing yet.\n")]
    for argv, unbuffered, said in runs:
        result = subprocess.run([sys.executable, *argv], cwd=REPO, stdout=write_end,
                                stderr=subprocess.PIPE, text=True, timeout=300,
                                env={**os.environ, "PYTHONUNBUFFERED": unbuffered})
        assert (result.returncode, result.stderr) == (1, said), argv[0]
    os.close(write_end)


## torchvision's import costs seconds, and a run with MNIST on disk needs none of it. One
## process runs each script's real work in turn, and reports whether torchvision was imported;
## then it checks that what load_mnist read is what torchvision reads from the same files.
WHOLE_RUNS = """
import sys, torch, mnist_train, predict, synthetic_train
from plumbing import files
def torchvision():
    return any(m.startswith("torchvision") for m in sys.modules)
print("mnist_train", mnist_train.main(["--data-dir", DATA, "--val-size", "200", "--epochs", "1",
                                       "--save-path", OUT + "/m.pt"]), torchvision())
print("predict", predict.main(["--checkpoint", OUT + "/m.pt", OUT + "/three.png"]), torchvision())
print("synthetic_train", synthetic_train.main(["--epochs", "1", "--samples", "256"]), torchvision())
images, labels = files.load_mnist(DATA, train=False)
from torchvision import datasets
theirs = datasets.MNIST(DATA, train=False, download=False)
print("same", torch.equal(images, theirs.data), torch.equal(labels, theirs.targets))
"""


def test_the_scripts_import_no_torchvision_and_read_mnist_as_it_does(tiny_mnist, tmp_path):
    digit_picture(3).save(tmp_path / "three.png")
    code = f"DATA, OUT = {str(tiny_mnist)!r}, {str(tmp_path)!r}\n" + WHOLE_RUNS
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=600)
    reports = [line for line in proc.stdout.splitlines()
               if line.split()[0] in ("mnist_train", "predict", "synthetic_train", "same")]
    assert reports == ["mnist_train 0 False", "predict 0 False", "synthetic_train 0 False",
                       "same True True"], proc.stderr[-2000:]
    assert (tmp_path / "m_mistakes.png").exists()  # the mistakes picture was drawn, by Pillow


@pytest.mark.parametrize("argv, hint", [
    (["--epoch", "3"], " (did you mean --epochs?)"),
    (["--epcohs=3"], " (did you mean --epochs?)"),  # a typo, with its value
    (["--", "foo"], ""),  # after "--" nothing is a flag: no hint, and never all of them
    (["foo"], ""),
])
def test_an_unknown_flag_near_a_real_one_is_named(capsys, argv, hint):
    parser = runs.ArgumentParser(prog="x")
    parser.add_argument("--epochs", type=int)
    parser.add_argument("--lr", type=float)
    with pytest.raises(SystemExit):
        parser.parse_args(argv)
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("x: error: unrecognized arguments: ") and last.endswith(
        hint or argv[-1])


def test_output_checks_create_the_folder_and_name_what_is_wrong(tmp_path):
    assert files.check_output_file(tmp_path / "new" / "deeper" / "m.pt") is None
    assert (tmp_path / "new" / "deeper").is_dir() and not os.listdir(tmp_path / "new" / "deeper")
    (tmp_path / "file").write_text("x")
    assert files.check_output_file(tmp_path / "file" / "m.pt") == \
        f"{tmp_path / 'file'} exists and is not a folder"
    assert files.check_output_file(tmp_path) == "is a directory; give a file name inside it"
    if hasattr(os, "geteuid") and os.geteuid() != 0:  # only a non-root POSIX run can check this
        (tmp_path / "locked").mkdir(mode=0o500)
        assert files.check_output_dir(tmp_path / "locked") == \
            f"cannot write files in {tmp_path / 'locked'}: Permission denied"


@pytest.mark.parametrize("rank, main", [("0", True), ("1", False)])
def test_only_rank_0_is_the_main_process_even_before_torch_distributed_starts(monkeypatch,
                                                                              rank, main):
    ## torchrun sets these for every process it starts; --resume prints its "resuming" line
    ## before the processes join up, and it must come from one of them only.
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", rank)
    assert runs.is_main_process() is main


def test_a_closed_output_as_an_earlier_run_s_files_are_kept_still_lets_them_be_put_back(
        tmp_path, monkeypatch):
    ## `| head -3` closes the pipe just as "an earlier run's files are kept" is said: the files
    ## are renamed by then, and the caller knows which, so that it can put them back.
    run = files.RunFiles.beside(tmp_path / "a.pt")
    run.model.write_bytes(b"an earlier run's model")
    run.csv.write_bytes(b"its metrics")
    moved = {}
    monkeypatch.setattr(sys, "stdout", Output(BrokenPipeError(errno.EPIPE, "Broken pipe")))
    with pytest.raises(BrokenPipeError):
        files.set_aside(run, moved)
    assert set(moved) == {run.model, run.csv} and not run.model.exists()
    assert [p.read_bytes() for p in moved.values()] == [b"an earlier run's model", b"its metrics"]


def test_a_run_stopped_as_it_sets_an_earlier_run_aside_puts_its_files_back(tmp_path,
                                                                          monkeypatch, capsys):
    ## mnist_train.py ... | head -0: the first line it says fails, after the renames.
    import mnist_train

    run = files.RunFiles.beside(tmp_path / "a.pt")
    run.model.write_bytes(b"an earlier run's model")
    run.csv.write_bytes(b"its metrics")
    monkeypatch.setattr(sys, "stdout", Output(BrokenPipeError(errno.EPIPE, "Broken pipe")))
    assert mnist_train.main(["--data-dir", str(tmp_path / "data"), "--save-path",
                             str(run.model)]) == 1
    assert "This run saved nothing: " in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == [".a.pt.lock", "a.csv", "a.pt"]  # back
    assert run.model.read_bytes() == b"an earlier run's model"
