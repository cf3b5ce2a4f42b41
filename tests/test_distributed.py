"""mnist_train.py under torchrun: 2 CPU processes with the gloo backend, on the tiny MNIST; and
leaving the process group cleanly."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import (
    digit_picture,
    printed_confusion_matrix,
    read_csv,
    standardised,
    start_waiting_run,
)

import common
import mnist_train
import predict
from plumbing import files

REPO = Path(__file__).resolve().parent.parent


## torchrun runs this file: mnist_train.py as `python mnist_train.py` runs it and, as the process
## exits, the names of its threads (Linux keeps each one's in /proc/self/task/<id>/comm), in
## one write, so that the two ranks' lines, on one stderr, do not mix.
WITH_THREADS_AT_EXIT = """
import atexit, os, runpy, sys
def threads():
    if os.path.isdir(tasks := "/proc/self/task"):
        names = [open(f"{tasks}/{t}/comm").read().strip() for t in os.listdir(tasks)]
        os.write(2, f"threads at exit: {sorted(names)}\\n".encode())
atexit.register(threads)
sys.path.insert(0, os.getcwd())
sys.argv[0] = "mnist_train.py"
runpy.run_path("mnist_train.py", run_name="__main__")
"""


@pytest.fixture(scope="module")
def two_process_run(tiny_mnist, tmp_path_factory):
    """One torchrun run with 2 processes and batch size 20: (stdout, checkpoint path, stderr)."""
    folder = tmp_path_factory.mktemp("ddp")
    (folder / "with_threads_at_exit.py").write_text(WITH_THREADS_AT_EXIT)
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         str(folder / "with_threads_at_exit.py"), "--data-dir", str(tiny_mnist), "--val-size",
         "201", "--subset", "560", "--batch-size", "20", "--epochs", "2", "--save-path",
         str(folder / "ddp.pt")], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout, folder / "ddp.pt", proc.stderr


def test_only_rank_0_prints_and_its_checkpoint_loads_like_a_plain_one(two_process_run, tmp_path,
                                                                      capsys):
    out, save_path, _ = two_process_run
    assert out.count("Test Accuracy: ") == 1 and out.count("initial loss") == 1
    ## rank 0 tests on the whole test set: 200 images, in the accuracy and in the matrix
    assert "/200)" in out.split("Test Accuracy: ")[1].splitlines()[0]
    assert out.count("confusion matrix") == 1
    assert printed_confusion_matrix(out).sum() == 200
    assert save_path.with_name("ddp_mistakes.png").exists()
    state = files.read_checkpoint(save_path)["state_dict"]
    assert not any(key.startswith("module.") for key in state)
    digit_picture(4).save(tmp_path / "four.png")
    assert predict.main(["--checkpoint", str(save_path), str(tmp_path / "four.png")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"{save_path}: mlp") and lines[1].startswith(
        f"{tmp_path / 'four.png'}: ")


def test_printed_metrics_are_those_of_the_whole_validation_set(two_process_run, tiny_mnist):
    ## 201 validation images: the two ranks hold 101 and 100 of them.
    _, save_path, _ = two_process_run
    model, checkpoint = files.load_model(save_path)
    images, labels = files.load_mnist(tiny_mnist, train=True)
    val_idx = torch.randperm(len(labels), generator=torch.Generator().manual_seed(42))[:201]
    x = standardised(images[val_idx], checkpoint["mean"], checkpoint["std"])
    loss, acc = common.evaluate(model, [(x, labels[val_idx])], torch.nn.CrossEntropyLoss(), "cpu")
    rows = read_csv(save_path.with_suffix(".csv"))
    best = rows[checkpoint["epoch"] - 1]
    assert float(best["val_accuracy"]) == pytest.approx(acc, abs=1e-6)
    assert float(best["val_loss"]) == pytest.approx(loss, rel=1e-4)


def test_two_processes_with_batch_b_match_one_process_with_batch_2b(two_process_run, tiny_mnist,
                                                                    tmp_path):
    ## 560 training images, so no rank needs padding. Rank r takes every 2nd image of the
    ## shuffled order, so the two ranks' batches of 20 are
    ## exactly the single process's batch of 40, and DDP averages their gradients: the same
    ## update. Only the order of floating-point additions differs, so the losses agree closely
    ## but not bit for bit.
    _, save_path, _ = two_process_run
    single = tmp_path / "single.pt"
    assert mnist_train.main(["--data-dir", str(tiny_mnist), "--val-size", "201", "--subset", "560",
                             "--batch-size", "40", "--epochs", "2", "--save-path",
                             str(single)]) == 0
    for ddp_row, one_row in zip(read_csv(save_path.with_suffix(".csv")),
                                read_csv(single.with_suffix(".csv"))):
        for key in ("train_loss", "val_loss"):
            assert float(ddp_row[key]) == pytest.approx(float(one_row[key]), rel=1e-4), key


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(),
                    reason="lists threads through Linux's /proc")
def test_leaving_the_process_group_stops_gloos_threads(two_process_run):
    ## A thread of gloo still running while Python shuts down can abort a finished run at exit.
    ## Creating the optimizer imports torch.distributed.nn after the group exists; without the
    ## early import in runs.join_torchrun, that module would keep the group, and its
    ## threads, alive after leave_distributed().
    threads = re.findall(r"threads at exit: \[[^]]*\]", two_process_run[2])
    assert len(threads) == 2 and not any("gloo" in line for line in threads), threads


def test_torchruns_processes_hold_the_save_path_as_one_run(tiny_mnist, tmp_path, capsys):
    ## Its processes do not block each other, and a plain run on the same path is refused.
    save_path = tmp_path / "ddp.pt"
    argv = ["--data-dir", str(tiny_mnist), "--val-size", "200", "--subset", "200",
            "--batch-size", "20", "--epochs", "1", "--save-path", str(save_path)]
    proc, _, go = start_waiting_run(tmp_path / "torchrun", argv, torchrun=2)
    try:
        assert mnist_train.main(argv) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"error: {save_path} is in use by another run (pid ")
        assert ": torchrun --nproc_per_node=2 mnist_train.py --data-dir" in err
    finally:
        go.touch()
    assert proc.wait(timeout=300) == 0, (tmp_path / "torchrun" / "out.txt").read_text()[-3000:]
    assert files.load_model(save_path) and (tmp_path / ".ddp.pt.lock").read_bytes() == b""
