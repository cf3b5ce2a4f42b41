"""plumbing/files.py: files written whole, checkpoints read safely (this repo's and plain
state_dicts), MNIST's files and every way they can be missing or damaged, a run's files set
aside, and the hold on a save path."""

import builtins
import os
import pickle
import re

import pytest
import torch
from helpers import change_a_tensor_on_disk, posix_only
from torch import nn

import common
from plumbing import files


# checkpoints ------------------------------------------------------------------------------------
def save(path, model, name="mlp"):
    """A checkpoint, written as mnist_train.py writes its best model: whole."""
    with files.written_whole(path) as f:
        torch.save({"model_name": name, "state_dict": model.state_dict(), "mean": 0.1307,
                    "std": 0.3081, "epoch": 3, "val_accuracy": 0.97}, f)


def test_checkpoint_round_trip_gives_identical_outputs(tmp_path):
    common.set_seed(0)
    model = common.build_model("cnn").eval()
    save(tmp_path / "ck" / "best.pt", model, "cnn")
    loaded, checkpoint = files.load_model(tmp_path / "ck" / "best.pt")
    x = torch.randn(4, 1, 28, 28)
    assert torch.equal(model(x), loaded(x))
    assert checkpoint["epoch"] == 3 and checkpoint["mean"] == 0.1307
    assert checkpoint["model_name"] == "cnn" and checkpoint["val_accuracy"] == 0.97
    assert os.listdir(tmp_path / "ck") == ["best.pt"]  # no temporary file left behind


def same_outputs(a: nn.Module, b: nn.Module) -> bool:
    x = torch.randn(4, 1, 28, 28)
    return torch.equal(a.eval()(x), b.eval()(x))


def test_a_plain_state_dict_loads_as_the_model_its_names_and_shapes_describe(tmp_path):
    ## As mnist_minimal.py saves its best model: torch.save(model.state_dict(), path). Its MLP
    ## is fc1 (128, 784), fc2 (64, 128), fc3 (10, 64): common.MLP with its default sizes.
    common.set_seed(0)
    for model in (common.build_model("mlp"), common.build_model("mlp", hidden=[32]),
                  common.build_model("cnn", channels=(8, 4), hidden=16)):
        torch.save(model.state_dict(), tmp_path / "plain.pt")
        loaded, checkpoint = files.load_model(tmp_path / "plain.pt")
        assert type(loaded) is type(model) and same_outputs(loaded, model)
        assert (checkpoint["mean"], checkpoint["std"]) == (common.MNIST_MEAN, common.MNIST_STD)
        assert checkpoint["classes"] == [str(d) for d in range(10)]
    assert files.describe(checkpoint, loaded) == (
        "cnn, a state_dict alone: read with MNIST's mean and std")
    mlp = common.build_model("mlp")
    torch.save(mlp.state_dict(), tmp_path / "plain.pt")
    assert files.describe(*reversed(files.load_model(tmp_path / "plain.pt"))).startswith(
        "mlp 784-128-64-10, a state_dict alone")


def test_a_state_dict_of_a_wrapped_model_loads_without_the_wrappers_prefix(tmp_path):
    ## DataParallel and DistributedDataParallel keep the model in .module; torch.compile in
    ## ._orig_mod: their state_dicts' names start with "module." and "_orig_mod.".
    model = common.build_model("mlp")
    for wrapped in (nn.DataParallel(model), torch.compile(model)):
        torch.save(wrapped.state_dict(), tmp_path / "wrapped.pt")
        assert next(iter(torch.load(tmp_path / "wrapped.pt"))).endswith(".fc1.weight")
        assert same_outputs(files.load_model(tmp_path / "wrapped.pt")[0], model)


@pytest.mark.parametrize("shapes, message", [
    ## pytorch/examples' MNIST CNN: conv1, conv2, fc1, fc2, but fc1 takes 9216 inputs, not 3136
    ({"conv1.weight": (32, 1, 3, 3), "conv1.bias": (32,), "conv2.weight": (64, 32, 3, 3),
      "conv2.bias": (64,), "fc1.weight": (128, 9216), "fc1.bias": (128,),
      "fc2.weight": (10, 128), "fc2.bias": (10,)},
     r"does not fit the 'cnn' model that this code defines \(size mismatch for fc1\.weight"),
    ({"layer1.0.weight": (8, 3, 3, 3), "head.weight": (10, 8)},
     r"holds the weights of a model this code cannot rebuild \(layer1\.0\.weight, head"),
])
def test_a_state_dict_of_another_model_is_one_line_naming_what_can_be_rebuilt(tmp_path, shapes,
                                                                              message):
    torch.save({name: torch.zeros(shape) for name, shape in shapes.items()}, tmp_path / "x.pt")
    with pytest.raises(files.CheckpointError, match=message) as err:
        files.load_model(tmp_path / "x.pt")
    assert "it rebuilds common.py's MLP" in str(err.value) and "\n" not in str(err.value)


@posix_only
def test_a_name_too_long_for_the_temporary_file_is_one_output_error(tmp_path):
    with pytest.raises(files.OutputError, match="File name too long"):
        with files.written_whole(tmp_path / ("x" * 250)) as f:  # fits; its temporary does not
            f.write(b"data")
    assert list(tmp_path.iterdir()) == []


def test_interrupted_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "best.pt"
    save(path, common.build_model("mlp"))
    original = path.read_bytes()

    def write_half_then_interrupt(*args):
        raise KeyboardInterrupt  # as Ctrl-C would, in the middle of the write

    monkeypatch.setattr(files.os, "fsync", write_half_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        save(path, common.build_model("mlp"))
    assert path.read_bytes() == original
    assert os.listdir(tmp_path) == ["best.pt"]  # and no temporary file left behind


def test_a_checkpoint_that_would_run_code_is_refused_and_the_code_never_runs(tmp_path):
    marker = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    evil = tmp_path / "evil.pt"
    torch.save({"model_name": "mlp", "state_dict": {}, "mean": 0.0, "std": 1.0, "x": Exploit()},
               evil)
    with pytest.raises(files.CheckpointError, match=f"refused to load {evil}.*could run code"):
        files.read_checkpoint(evil)
    assert not marker.exists()


@pytest.mark.parametrize("name, content, message", [
    ("bad.pt", b"", "is not a checkpoint saved by this repo$"),
    ("bad.pt", b"this is a text file, not a checkpoint", "is not a checkpoint saved by this repo$"),
    ("bad.pt", pickle.dumps([1, 2, 3]), "is not a checkpoint saved by this repo$"),
    ("list.pt", "torch.save", "is a PyTorch file but neither a checkpoint of this repo"),
    ("digit.png", b"\x89PNG\r\n\x1a\n", "is not a checkpoint saved by this repo$"),
])
def test_files_that_are_not_checkpoints_are_named_in_the_error(tmp_path, name, content, message):
    path = tmp_path / name
    if content == "torch.save":
        torch.save([1, 2, 3], path)
    else:
        path.write_bytes(content)
    with pytest.raises(files.CheckpointError, match=message) as err:
        files.load_model(path)
    assert str(err.value).startswith(str(path)) and "weights_only" not in str(err.value)


@pytest.mark.parametrize("damage", ["cut short", "a changed byte", "a changed length"])
def test_a_checkpoint_cut_short_or_changed_after_saving_is_refused(tmp_path, damage):
    path = tmp_path / "best.pt"
    save(path, common.build_model("mlp"))
    if damage == "cut short":
        path.write_bytes(path.read_bytes()[:5000])
    else:  # torch.load itself would read these, with wrong weights: its archive's checksums tell
        change_a_tensor_on_disk(path, "data" if damage == "a changed byte" else "header")
        torch.load(path, weights_only=True)
    with pytest.raises(files.CheckpointError, match=f"^{re.escape(str(path))} is cut short or "
                       "damaged .*: use a good copy, or train again$"):
        files.load_model(path)


def test_a_checkpoint_saved_without_checksums_still_loads(tmp_path):
    ## torch.serialization.set_crc32_options(False) leaves every checksum at 0: nothing to check.
    before = torch.serialization.get_crc32_options()
    torch.serialization.set_crc32_options(False)
    model = common.build_model("mlp")
    try:
        save(tmp_path / "best.pt", model)
    finally:
        torch.serialization.set_crc32_options(before)
    loaded, _ = files.load_model(tmp_path / "best.pt")
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(),
                                                 model.state_dict().values(), strict=True))


def test_checkpoints_for_other_models_are_refused(tmp_path):
    torch.save({"model_name": "mlp", "weights": torch.zeros(3)}, tmp_path / "other.pt")
    with pytest.raises(files.CheckpointError, match=r"neither a checkpoint of this repo \(the "
                       r"keys model_name, state_dict, mean, std\) nor a model's state_dict"):
        files.load_model(tmp_path / "other.pt")
    save(tmp_path / "mismatch.pt", common.build_model("mlp"), name="cnn")
    ## PyTorch's message starts with a heading line; the first line that says what differs
    ## is the one shown.
    with pytest.raises(files.CheckpointError, match=r"does not fit the 'cnn' model that this "
                       r"code defines \(Missing key\(s\) in state_dict: \"conv1\.weight\""):
        files.load_model(tmp_path / "mismatch.pt")
    save(tmp_path / "wide.pt", common.build_model("mlp", hidden=[256, 64]))
    with pytest.raises(files.CheckpointError, match=r"\(size mismatch for fc1\.weight: copying "
                       r"a param with shape torch\.Size\(\[256, 784\]\) from checkpoint"):
        files.load_model(tmp_path / "wide.pt")
    save(tmp_path / "unknown.pt", nn.Linear(2, 2), name="resnet")
    with pytest.raises(files.CheckpointError, match="'resnet' model .*unknown model 'resnet'"):
        files.load_model(tmp_path / "unknown.pt")
    with pytest.raises(files.CheckpointError, match="does not exist"):
        files.load_model(tmp_path / "missing.pt")
    with pytest.raises(files.CheckpointError, match="is a folder, a device or a pipe, not a"):
        files.load_model(tmp_path)


@pytest.mark.parametrize("values", [{"std": 0.0}, {"mean": float("nan")}, {"std": "0.3"},
                                    {"classes": ["a", "b"]}, {"classes": list(range(10))}])
def test_a_hand_made_checkpoint_with_unusable_values_is_refused_when_loaded(tmp_path, values):
    ## Such values would otherwise fail later, one picture at a time (a std of 0: nan%).
    save(tmp_path / "good.pt", common.build_model("mlp"))
    checkpoint = torch.load(tmp_path / "good.pt", weights_only=True)
    torch.save({**checkpoint, **values}, tmp_path / "hand_made.pt")
    with pytest.raises(files.CheckpointError, match="values this code cannot use"):
        files.load_model(tmp_path / "hand_made.pt")
    files.load_model(tmp_path / "good.pt")  # the same checkpoint, unchanged, loads


def write(path, data: bytes) -> None:
    with files.written_whole(path) as f:
        f.write(data)


# writing files whole ---------------------------------------------------------------------------
@posix_only
@pytest.mark.parametrize("kind", ["fifo", "link to a fifo", "directory"])
def test_saving_never_replaces_anything_but_a_regular_file(tmp_path, kind):
    ## A FIFO stands in for /dev/null: os.replace would turn either into a regular file.
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    names = {"fifo": "fifo", "link to a fifo": "link", "directory": "dir"}
    target = tmp_path / names[kind]
    if kind == "link to a fifo":
        target.symlink_to(fifo)
    if kind == "directory":
        target.mkdir()
    with pytest.raises(files.OutputError, match="is not a regular file, and will not be replaced"):
        save(target, common.build_model("mlp"))
    assert fifo.is_fifo() and (kind != "directory" or target.is_dir())
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted({"fifo", names[kind]})


def test_a_write_error_partway_keeps_the_old_file_and_leaves_no_temporary_file(tmp_path,
                                                                             monkeypatch):
    import errno

    path = tmp_path / "best.pt"
    save(path, common.build_model("mlp"))
    original = path.read_bytes()

    class FullDisk:  # a file whose disk fills up after 1,000 bytes
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, data):
            self.f.write(data[:1000])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(files, "open", lambda *args: FullDisk(builtins.open(*args)),
                        raising=False)
    with pytest.raises(files.OutputError,
                       match=f"could not write {path}: No space left on device"):
        save(path, common.build_model("cnn"), "cnn")
    assert path.read_bytes() == original and os.listdir(tmp_path) == ["best.pt"]


def test_a_file_another_program_holds_for_a_moment_is_written_after_a_retry(tmp_path,
                                                                           monkeypatch):
    ## Windows: os.replace fails with PermissionError while a virus scanner has the file open.
    real, calls = os.replace, []

    def busy_twice(source, target):
        calls.append(target)
        if len(calls) <= 2:
            raise PermissionError(13, "Access is denied")
        real(source, target)

    monkeypatch.setattr(files.os, "replace", busy_twice)
    write(tmp_path / "m.csv", b"epoch\n1\n")
    assert len(calls) == 3 and (tmp_path / "m.csv").read_bytes() == b"epoch\n1\n"


def test_a_file_another_program_keeps_open_is_named_with_what_to_do(tmp_path, monkeypatch):
    (tmp_path / "m.csv").write_bytes(b"old")

    def always_busy(source, target):
        raise PermissionError(13, "Access is denied")

    monkeypatch.setattr(files.os, "replace", always_busy)
    monkeypatch.setattr(files.time, "sleep", lambda seconds: None)
    monkeypatch.setattr(files.sys, "platform", "win32")
    with pytest.raises(files.OutputError) as err:
        write(tmp_path / "m.csv", b"new")
    assert str(err.value).startswith(f"could not write {tmp_path / 'm.csv'}: Access is denied. "
                                     "On Windows this means another program holds the file open")
    monkeypatch.setattr(files.sys, "platform", "linux")  # there, a plain permission problem
    with pytest.raises(files.OutputError) as err:
        write(tmp_path / "m.csv", b"new")
    assert "another program" not in str(err.value)
    assert (tmp_path / "m.csv").read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.csv"]  # no temporary file left


# MNIST files ------------------------------------------------------------------------------------
def test_load_mnist_reads_idx_files_as_torchvision_does(tiny_mnist):
    from torchvision import datasets

    images, labels = files.load_mnist(tiny_mnist, train=False)
    theirs = datasets.MNIST(tiny_mnist, train=False, download=False)
    assert images.dtype == torch.uint8 and labels.dtype == torch.int64
    assert torch.equal(images, theirs.data) and torch.equal(labels, theirs.targets)


@pytest.mark.parametrize("given", ["MNIST", "MNIST/raw"])
def test_a_data_folder_one_level_too_deep_gets_the_right_one_named(tiny_mnist, given):
    with pytest.raises(files.DataError) as err:
        files.download_mnist(tiny_mnist / given, "MNIST")
    assert str(err.value) == (
        f"MNIST is not in {tiny_mnist / given / 'MNIST' / 'raw'}/, but its files are in "
        f"{tiny_mnist / 'MNIST' / 'raw'}/: give {tiny_mnist} as the data folder (it holds "
        "MNIST/raw/)")


def test_images_and_labels_that_do_not_go_together_are_refused(tiny_mnist_copy):
    from conftest import write_idx

    raw = tiny_mnist_copy / "MNIST" / "raw"
    write_idx(raw / "t10k-labels-idx1-ubyte", torch.zeros(199, dtype=torch.uint8))
    with pytest.raises(files.DataError, match=r"hold \[200, 28, 28\] images and \[199\] "
                       "labels, where N x 28 x 28 and N .* delete both"):
        files.load_mnist(tiny_mnist_copy, train=False)
    write_idx(raw / "t10k-images-idx3-ubyte", torch.zeros(0, 28, 28, dtype=torch.uint8))
    write_idx(raw / "t10k-labels-idx1-ubyte", torch.zeros(0, dtype=torch.uint8))
    with pytest.raises(files.DataError, match=r"t10k-images-idx3-ubyte is damaged"):
        files.load_mnist(tiny_mnist_copy, train=False)


def test_a_damaged_idx_file_is_named_with_the_fix(tiny_mnist_copy, tmp_path):
    path = tiny_mnist_copy / "MNIST" / "raw" / "train-images-idx3-ubyte"
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(files.DataError, match=f"{path} is damaged or cut short .*Delete it"):
        files.load_mnist(tiny_mnist_copy, train=True)
    (tmp_path / "text").write_bytes(b"not an IDX file")
    ## A damaged header that promises 3 x (2**32 - 1) bytes is refused before any is allocated.
    (tmp_path / "huge").write_bytes(b"\x00\x00\x08\x03" + b"\xff" * 12 + b"abc")
    for name in ("text", "huge"):
        with pytest.raises(files.DataError, match=f"{name} is damaged"):
            files.read_idx(tmp_path / name)
    (tmp_path / "whole").write_bytes(b"\x00\x00\x08\x01" + (3).to_bytes(4, "big") + b"abc")
    assert files.read_idx(tmp_path / "whole").tolist() == [97, 98, 99]


def test_mnist_files_that_cannot_be_read_are_one_line(tiny_mnist_copy, monkeypatch):
    label_file = tiny_mnist_copy / "MNIST" / "raw" / "t10k-labels-idx1-ubyte"
    label_file.unlink()
    label_file.mkdir()  # a folder where the file belongs
    with pytest.raises(files.DataError,
                       match=f"^{re.escape(str(label_file))} cannot be read: "):
        files.load_mnist(tiny_mnist_copy, train=False)

    def refuse(*args, **kwargs):  # root reads everything, so the refusal is simulated
        raise PermissionError(13, "Permission denied", str(args[0]))

    monkeypatch.setattr("builtins.open", refuse)
    with pytest.raises(files.DataError, match="cannot be read: Permission denied$"):
        files.load_mnist(tiny_mnist_copy, train=True)


def test_missing_mnist_offline_says_which_folder_and_leaves_no_empty_folders(tmp_path,
                                                                           no_network):
    with pytest.raises(files.DataError) as err:
        files.download_mnist(tmp_path / "typo" / "data", "MNIST")
    message = str(err.value)
    assert f"MNIST is not in {tmp_path / 'typo' / 'data' / 'MNIST' / 'raw'}/" in message
    assert "online" in message and "unpacked" in message and "gunzip" in message
    ## the reason is the mirror's own answer, not an empty "Error downloading ...:"
    assert "downloading it failed: <urlopen error" in message and ":." not in message
    assert not (tmp_path / "typo").exists()
    ## a data folder that is a file: the same one line, with the reason
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(files.DataError, match="downloading it failed: .*otes.txt"):
        files.download_mnist(tmp_path / "notes.txt", "MNIST")
    ## load_mnist itself downloads nothing: it says where the files belong.
    missing = f"MNIST is not in {tmp_path / 'MNIST' / 'raw'}/: put its four files there"
    with pytest.raises(files.DataError, match=missing):
        files.load_mnist(tmp_path)


def test_a_damaged_gz_file_is_named_as_the_likely_cause(tmp_path, no_network):
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    (raw / "train-images-idx3-ubyte.gz").write_bytes(b"\x1f\x8b not really gzip")
    with pytest.raises(files.DataError, match="gunzip -k a .gz that torchvision"):
        files.download_mnist(tmp_path, "MNIST")




# the hold on a save path -------------------------------------------------------------------------
def test_a_hold_is_let_go_of_emptied_and_a_name_left_in_it_is_a_run_that_was_stopped(
        tmp_path, capsys):
    held = files.hold(tmp_path / "m.pt", "this run")
    assert (tmp_path / ".m.pt.lock").read_text() == "this run"  # for a run that finds it held
    files.release(held)
    assert (tmp_path / ".m.pt.lock").read_text() == ""  # ended as it should
    files.release(files.hold(tmp_path / "m.pt", "the next run"))
    assert capsys.readouterr().out == ""  # nothing to say
    (tmp_path / ".m.pt.lock").write_text("pid 7, killed")  # as a run killed with SIGKILL leaves it
    files.release(files.hold(tmp_path / "m.pt", "a third run"))
    assert capsys.readouterr().out == (f"note: {tmp_path / 'm.pt'} was held by a run that was "
                                       "stopped without ending (pid 7, killed); this run takes "
                                       "it over\n")
