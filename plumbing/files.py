"""Files that are written whole, checkpoints that are read safely, MNIST's files (fetched once,
then read without torchvision), and the files of a training run: set aside when a new run
starts, held while it trains."""

import contextlib
import errno
import io
import math
import os
import socket
import sys
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, NamedTuple

import torch
from torch import nn

import common

try:  # how a process holds a file (see hold()): Linux and macOS lock it whole,
    import fcntl
except ImportError:  # Windows locks a range of its bytes
    fcntl = None
    import msvcrt


class OutputError(Exception):
    """A file that could not be written: a bad path, a full disk, an I/O error."""


class CheckpointError(ValueError):
    """A checkpoint that is missing, damaged, unsafe to load, or made for another model."""


class InUse(Exception):
    """A save path that another run holds while it trains."""


# writing whole -------------------------------------------------------------------------------
@contextlib.contextmanager
def written_whole(path: str | Path) -> Iterator[BinaryIO]:
    """`with written_whole(path) as f: torch.save(thing, f)`: afterwards the file `path` holds
    its old bytes or the new ones, whole, whatever stopped the program (a crash, Ctrl-C, a full
    disk). They are written to memory first, then to a temporary file beside it, which is
    renamed over it once complete."""
    buffer = io.BytesIO()  # a write that fails halfway fails here, not in torch.save's zip
    yield buffer
    real = Path(os.path.realpath(path))  # through a symlink: replace the file it points to
    tmp = temporary_name(real)
    try:
        if real.exists() and not real.is_file():  # a folder, /dev/null, a FIFO: never replaced
            raise OutputError(f"{path} is not a regular file, and will not be replaced")
        real.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            f.write(buffer.getbuffer())
            f.flush()
            os.fsync(f.fileno())  # on disk before the rename makes it visible
        for wait in (0.1, 0.2, 0.3, 0.4):  # Windows: a virus scanner may hold the file a moment
            with contextlib.suppress(PermissionError):
                return os.replace(tmp, real)  # atomic: the old file or the new one
            time.sleep(wait)
        os.replace(tmp, real)  # the last try: its error is reported
    except OSError as err:
        held = (" On Windows this means another program holds the file open: close it."
                if sys.platform == "win32" and isinstance(err, PermissionError) else "")
        raise OutputError(f"could not write {path}: {err.strerror or err}.{held} The previous "
                          "version of that file, if there was one, is unchanged.") from err
    finally:
        with contextlib.suppress(OSError):  # gone already after the rename
            tmp.unlink(missing_ok=True)


def temporary_name(path: Path) -> Path:
    """The hidden name beside `path` that written_whole() writes first."""
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


# reading checkpoints --------------------------------------------------------------------------
def read_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict:
    """A checkpoint as a dict with the keys state_dict, model_name, sizes, mean and std: one of
    mnist_train.py, or a plain state_dict (torch.save(model.state_dict(), path)) of a model of
    common.py. Anything that could run code while loading is refused."""
    if not os.path.isfile(path):  # os.path: a name too long to look up is no file, not an error
        raise CheckpointError(f"checkpoint {path} " + ("is a folder, a device or a pipe, not a "
                              ".pt file" if os.path.exists(path) else "does not exist"))
    try:
        with open(path, "rb") as f:
            zipped = f.read(4) == b"PK\x03\x04"  # torch.save writes a zip archive
    except OSError as err:  # a file this user may not read
        raise CheckpointError(f"{path} cannot be read: {err.strerror}") from None
    if not zipped:  # a picture, say, given as the checkpoint
        raise CheckpointError(f"{path} is not a checkpoint saved by this repo")
    try:
        with zipfile.ZipFile(path) as archive:  # its checksums, which torch.load does not check
            for part in archive.infolist():
                if part.CRC:  # 0: saved without checksums
                    archive.read(part)
        ## weights_only=True unpickles tensors and plain values only: a pickle can otherwise
        ## name any function to call while loading, so a downloaded .pt file could run code.
        checkpoint = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:
        if "GLOBAL" in str(err):  # the pickle names a function or class to import and call
            raise CheckpointError(f"refused to load {path}: it holds Python objects, not just "
                                  "tensors and numbers, and loading it could run code") from None
        raise CheckpointError(f"{path} is cut short or damaged ({type(err).__name__}): use a "
                              "good copy, or train again") from None
    if isinstance(checkpoint, dict) and checkpoint and all(
            isinstance(value, torch.Tensor) for value in checkpoint.values()):
        return plain_state_dict(path, checkpoint)
    needed = ("model_name", "state_dict", "mean", "std")
    if not isinstance(checkpoint, dict) or not all(key in checkpoint for key in needed):
        raise CheckpointError(f"{path} is a PyTorch file but neither a checkpoint of this repo "
                              f"(the keys {', '.join(needed)}) nor a model's state_dict")
    return {"sizes": {}, "classes": [str(d) for d in range(10)], **checkpoint}  # older: digits


def plain_state_dict(path: str | Path, state: dict) -> dict:
    """The checkpoint of a plain state_dict: its names and shapes say which model of common.py
    it fits, and MNIST's mean and std are those it was trained with (as mnist_minimal.py's)."""
    ## DistributedDataParallel and torch.compile add these to the names of the model's weights.
    state = {k.removeprefix("module.").removeprefix("_orig_mod."): v for k, v in state.items()}
    ## The sizes of fc1, fc2, ...: the MLP's hidden layers, or the CNN's one; then the classes.
    fc = [len(state[f"fc{i}.weight"]) for i in range(1, len(state) + 1) if f"fc{i}.weight" in state]
    try:
        name, sizes = ("cnn", {"channels": (len(state["conv1.weight"]), len(state["conv2.weight"])),
                               "hidden": fc[0]}) if "conv1.weight" in state else (
                       "mlp", {"hidden": fc[:-1]})
        classes = fc[-1]
    except (KeyError, IndexError):
        raise CheckpointError(f"{path} holds the weights of a model this code cannot rebuild "
                              f"({', '.join(list(state)[:4])}, ...): {REBUILDS}") from None
    return {"model_name": name, "sizes": {**sizes, "num_classes": classes}, "state_dict": state,
            "mean": common.MNIST_MEAN, "std": common.MNIST_STD,
            "classes": [str(c) for c in range(classes)], "plain": True}


REBUILDS = ("it rebuilds common.py's MLP (fc1, fc2, ... from 28 x 28 = 784 inputs) and CNN "
            "(conv1, conv2, fc1, fc2 on 1 x 28 x 28 pictures), as mnist_minimal.py and "
            "mnist_train.py save them")


def load_model(path: str | Path, device: str | torch.device = "cpu") -> tuple[nn.Module, dict]:
    """The checkpoint's model, ready to use: its class rebuilt by name and sizes, its weights
    loaded into it; and the checkpoint (read_checkpoint's dict)."""
    checkpoint = read_checkpoint(path, map_location=device)
    with explain_misfit(path, f"the {checkpoint['model_name']!r} model that this code defines",
                        REBUILDS if checkpoint.get("plain") else
                        "retrain it, or restore the model code it was trained with"):
        model = common.build_model(checkpoint["model_name"], **checkpoint["sizes"])
        model.load_state_dict(checkpoint["state_dict"])  # strict: every name and shape must match
    check_values(path, checkpoint, model)
    return model.to(device).eval(), checkpoint


@contextlib.contextmanager
def explain_misfit(path: str | Path, what: str, next_step: str) -> Iterator[None]:
    """Turn load_state_dict()'s error for weights that do not fit `what` into one line."""
    try:
        yield
    except (KeyError, TypeError, ValueError, RuntimeError) as err:
        ## load_state_dict's message starts with a heading line; the next says what differs.
        lines = [line.strip() for line in str(err).splitlines() if line.strip()] or [""]
        raise CheckpointError(f"{path} does not fit {what} ({lines[len(lines) > 1].rstrip('. ')})"
                              f": {next_step}") from None


def check_values(path: str | Path, checkpoint: dict, model: nn.Module) -> None:
    """Refuse values that would only fail later, one picture at a time (a std of 0: nan%)."""
    outputs = list(model.parameters())[-1].shape[0]  # the last layer's bias: one per class
    mean, std = checkpoint["mean"], checkpoint["std"]
    names = checkpoint.get("classes", [""] * outputs)
    if not (all(isinstance(v, (int, float)) and math.isfinite(v) for v in (mean, std)) and std > 0
            and isinstance(names, list) and len(names) == outputs
            and all(isinstance(name, str) for name in names)):
        raise CheckpointError(f"{path} holds values this code cannot use (mean {mean!r}, std "
                              f"{std!r}, classes {names!r}): the std must be above 0, and the "
                              f"classes {outputs} names")


def describe(checkpoint: dict, model: nn.Module | None = None) -> str:
    """'mlp 784-128-64-10, epoch 4, val acc 0.9720' (and the dataset, when not MNIST)."""
    name = checkpoint["model_name"]
    if isinstance(model, common.MLP):  # its layer sizes, from the layers themselves
        layers = [layer for layer in model if isinstance(layer, nn.Linear)]
        name += " " + "-".join(map(str, [layers[0].in_features, *(x.out_features for x in layers)]))
    if checkpoint.get("plain"):
        return f"{name}, a state_dict alone: read with MNIST's mean and std"
    data = checkpoint.get("dataset", "mnist")
    accuracy = checkpoint.get("val_accuracy")  # made by hand, a checkpoint may give no number
    accuracy = f"{accuracy:.4f}" if isinstance(accuracy, (int, float)) else "?"
    return (f"{name}{'' if data == 'mnist' else f' on {data}'}, epoch "
            f"{checkpoint.get('epoch', '?')}, val acc {accuracy}")


def checkpoint_error(err: CheckpointError, path: Path, given: Path | None,
                     model: str | None) -> str:
    """predict.py's line for a checkpoint it cannot use; for one that does not exist, with the
    command that makes it (`given`: its --checkpoint, `model`: its --model)."""
    if os.path.exists(path):
        return f"error: {err}."
    how = f" --save-path {path}" if given else f" --model {model}" * (model not in (None, "mlp"))
    cnn = " (for a CNN, add --model cnn)" * bool(given)  # the command comes last
    return (f"error: checkpoint {path.resolve()} does not exist. Train one first{cnn}: python "
            f"mnist_train.py{how}")


# MNIST's files -------------------------------------------------------------------------------
class DataError(ValueError):
    """Training data that cannot be used: missing or damaged files, labels out of range."""


def load_mnist(data_dir: str | Path, train: bool = True,
         dataset: str = "MNIST") -> tuple[torch.Tensor, torch.Tensor]:
    """The images (uint8, N x 28 x 28) and labels (int64) of MNIST, or of another dataset in its
    format ("FashionMNIST"), from DATA_DIR/<dataset>/raw/ (download_mnist() fills it). Read in
    milliseconds, without torchvision, whose import alone takes seconds."""
    raw = Path(data_dir) / dataset / "raw"
    files = [raw / f"{'train' if train else 't10k'}-{kind}-ubyte"
             for kind in ("images-idx3", "labels-idx1")]
    if not all(file.exists() for file in files):
        raise DataError(f"{dataset} is not in {raw}/: put its four files there, unpacked "
                        "(python mnist_train.py downloads them)")
    try:
        images, labels = read_idx(files[0]), read_idx(files[1]).long()
    except OSError as err:  # a file this user may not read, a folder where a file belongs
        raise DataError(f"{err.filename} cannot be read: {err.strerror}") from err
    check_data(images, labels, files)
    return images, labels


def check_data(images: torch.Tensor, labels: torch.Tensor, files: list[Path]) -> None:
    """Refuse, once, where they are loaded (not per batch), what training cannot use."""
    if images.dim() != 3 or images.shape[1:] != (28, 28) or len(images) != len(labels):
        raise DataError(f"{files[0]} and {files[1]} hold {list(images.shape)} images and "
                        f"{list(labels.shape)} labels, where N x 28 x 28 and N are expected: "
                        "delete both, and their .gz files, then run again")
    if len(bad := ((labels < 0) | (labels > 9)).nonzero()):
        raise DataError(f"label {int(labels[bad[0]])} at position {int(bad[0])} of {files[1]} "
                        "is outside 0..9: class labels must be 0 to C-1 (remap 1..10 to 0..9; "
                        "on a GPU, a label of 10 fails as an unreadable device-side assert)")


def read_idx(path: str | Path) -> torch.Tensor:
    """Read an IDX file (MNIST's format: a header of sizes, then one byte per value) as uint8."""
    with open(path, "rb") as f:
        magic = f.read(4)  # two zero bytes, 0x08 (unsigned bytes), the number of dimensions
        dims = magic[3] if len(magic) == 4 and magic[:3] == b"\x00\x00\x08" else 0
        header = f.read(4 * dims)
        shape = [int.from_bytes(header[i : i + 4], "big") for i in range(0, len(header), 4)]
        if not 1 <= dims <= 3 or len(header) < 4 * dims or not math.prod(shape) or (
                os.fstat(f.fileno()).st_size != 4 + 4 * dims + math.prod(shape)):
            raise DataError(f"{path} is damaged or cut short (not the IDX file its name says). "
                            "Delete it, and its .gz if there is one, then run again.")
        data = bytearray(math.prod(shape))
        f.readinto(data)  # straight into the buffer the tensor will use: no second copy
    return torch.frombuffer(data, dtype=torch.uint8).view(shape)


def download_mnist(data_dir: str | Path, dataset: str) -> None:
    """Fetch <data_dir>/<dataset>/raw/ with torchvision if a file is missing; failing: DataError."""
    raw = (data_dir := Path(data_dir)) / dataset / "raw"
    if all((raw / f"{split}-{kind}-ubyte").exists() for split in ("train", "t10k")
           for kind in ("images-idx3", "labels-idx1")):
        return
    from torchvision import datasets  # only now: its import alone takes seconds

    for folder in (data_dir / "raw", data_dir):  # data_dir named MNIST/raw or MNIST itself?
        if (folder / "train-images-idx3-ubyte").exists():
            root = folder.parent.parent if folder.name == "raw" else folder.parent
            raise DataError(f"{dataset} is not in {raw}/, but its files are in {folder}/: "
                            f"give {root} as the data folder (it holds {dataset}/raw/)")
    new, timeout = [f for f in (raw, *raw.parents) if not f.exists()], socket.getdefaulttimeout()
    socket.setdefaulttimeout(30)  # a blocked network fails after 30 s instead of hanging
    try:
        getattr(datasets, dataset)(root=data_dir, download=True)
    except (RuntimeError, OSError) as err:  # offline, a blocked mirror, a bad .gz, a full disk
        for folder in new:  # no empty folders left behind by a typo in the path
            with contextlib.suppress(OSError):
                folder.rmdir()
        reason = ([line.strip() for line in str(err).splitlines() if line.strip()]
                  or [type(err).__name__])[-1].rstrip(".")  # the last mirror's answer
        raise DataError(f"{dataset} is not in {raw}/ and downloading it failed: {reason}. "
                        f"Run once online, or put its four files into {raw}/, unpacked "
                        "(gunzip -k a .gz that torchvision's checksum refuses)") from None
    finally:
        socket.setdefaulttimeout(timeout)


# the files of a training run -----------------------------------------------------------------
class RunFiles(NamedTuple):
    """A run's files: the best model (which predict.py loads), the last epoch's state (which
    --resume goes on from), the metrics (.csv) and the pictures of the mistakes."""
    model: Path
    last: Path
    csv: Path
    mistakes: Path

    @classmethod
    def beside(cls, model: Path) -> "RunFiles":
        return cls(model, model.with_name(f"{model.stem}_last{model.suffix}"),
                   model.with_suffix(".csv"), model.with_name(f"{model.stem}_mistakes.png"))


def check_outputs(run: RunFiles, log_flag: str, log_dir: str | None) -> str | None:
    """Why a run's files, or its log folder, cannot be written (a message), or None."""
    files = {"--save-path": run.model, "its state for --resume": run.last, "its CSV": run.csv,
             "its mistakes picture": run.mistakes}  # as the messages name them
    same = [os.path.abspath(p).casefold() for p in files.values()]  # m.CSV is m.csv on Windows
    if len(set(same)) < len(same):  # --save-path m.csv: the metrics would be written over it
        return (f"--save-path {run.model}: the run's other files would be written over it; give "
                "it another suffix, such as .pt")
    for what, path in files.items():
        if problem := check_output_file(path):
            return f"{what} {path}: {problem}"
    if log_dir is not None:
        if not log_dir.strip() or os.path.abspath(log_dir).casefold() in same:
            return f"{log_flag} {log_dir!r}: give it a folder of its own, such as runs/mnist"
        if problem := check_output_dir(log_dir):
            return f"{log_flag} {log_dir}: {problem}"
    return None


def check_output_file(path: str | Path) -> str | None:
    """Why written_whole() cannot write `path`, or None. Creates its folder."""
    if os.path.isdir(path):
        return "is a directory; give a file name inside it"
    if os.path.exists(path) and not os.path.isfile(path):  # /dev/null, a FIFO: never replaced
        return ("is not a regular file (a device or a pipe), and will not be replaced. To keep "
                "nothing, save into a temporary folder instead")
    real = Path(os.path.realpath(path))
    try:  # permissions, a read-only disk, a name too long: only writing tells for sure
        real.parent.mkdir(parents=True, exist_ok=True)
        (probe := temporary_name(real)).touch(exist_ok=False)  # the longer name, too
        probe.unlink()
    except FileExistsError:
        return f"{real.parent} exists and is not a folder"
    except OSError as err:
        return (f"cannot be written: {err.strerror}" if err.errno == errno.ENAMETOOLONG else
                f"cannot write files in {real.parent}: {err.strerror}")
    return None


def check_output_dir(folder: str | Path) -> str | None:
    """Why files cannot be written in `folder`, or None. Creates the folder."""
    return check_output_file(Path(folder, ".write-test"))


def set_aside(files: RunFiles, moved: dict[Path, Path]) -> None:
    """Rename an earlier run's files, so that a new run never replaces them, to names stamped
    with the time its model was written (mnist_mlp.2026-12-01_10-05-33.pt), and say so. `moved`
    gets {old: new} as they go: the caller can undo it, even after a failure halfway."""
    found, stem = [p for p in files if p.exists()], files.model.stem
    if not found:
        return
    stamp = time.strftime("%Y-%m-%d_%H-%M-%S", time.localtime(found[0].stat().st_mtime))
    for n in range(1, 1000):  # two runs saved in the same second: -2, -3, ...
        tag = f"{stamp}-{n}" if n > 1 else stamp
        moves = {p: p.with_name(f"{stem}.{tag}{p.name[len(stem):]}") for p in found}
        if not any(new.exists() for new in moves.values()):
            break
    for old, new in moves.items():
        try:
            os.replace(old, new)
        except OSError as err:
            raise OutputError(f"could not rename the earlier run's {old}: {err.strerror}. "
                              "Nothing was replaced") from err
        moved[old] = new
    (old, new), *rest = moves.items()
    extras = [p.name[len(stem):] for p, _ in rest]
    print(f"an earlier run's files are kept: {old} -> {new}"
          + (f", with its {', '.join(extras)}" if extras else ""))


def read_state(path: Path) -> dict:
    """save_state()'s training state, with the model's state_dict as "model"."""
    checkpoint = read_checkpoint(path)
    return {**checkpoint["training"], "model": checkpoint["state_dict"]}


def save_state(path: Path, state: dict, history: list, about: dict, settings: list) -> None:
    """Save what --resume needs to go on after the last epoch of `history`, as if never stopped:
    the model ("state_dict", as in any checkpoint, with `about`), and in "training" the
    state_dict() of `state`'s other objects, the random numbers and the run's `settings`."""
    training = {name: thing.state_dict() for name, thing in state.items() if thing is not None}
    epoch, val_acc = history[-1][0], history[-1][3]
    with written_whole(path) as f:  # predict.py can load this file too
        torch.save({"state_dict": training.pop("model"), "epoch": epoch, "val_accuracy": val_acc,
                    **about, "training": {**training, "epoch": epoch, "history": history,
                                          "rng": torch.get_rng_state(), "settings": settings}}, f)


# the hold on a save path ---------------------------------------------------------------------
## Two runs that wrote to one path at once would replace each other's model without a word. So a
## run holds its path while it trains: it locks a hidden file beside the model, and writes in it
## who it is. The operating system lets go of a lock when its process ends, however it ends (a
## crash, `kill -9`, a power cut), so no hold outlives its run; a run that ends as it should
## empties the file, and the next run that finds a name in it knows that its run was stopped.
LOCKED_BYTE = 2**30  # Windows locks bytes, and others cannot read them: one far past the text


def hold(model: Path, owner: str) -> BinaryIO:
    """Hold `model`'s path for this run (described by `owner`) until release(); if another run
    holds it, raise InUse."""
    file = open(model.with_name(f".{model.name}.lock"), "a+b")  # created if missing, then kept
    try:
        locked = lock(file)
        file.seek(0)
        found = file.read().decode(errors="replace").strip()  # who holds it, or held it last
    except BaseException:
        file.close()
        raise
    if not locked:
        file.close()
        raise InUse(f"{model} is in use by another run ({found or 'starting'}): wait until it "
                    "ends, or give this run a --save-path of its own")
    if found:
        print(f"note: {model} was held by a run that was stopped without ending ({found}); "
              "this run takes it over")
    file.truncate(0)
    file.write(owner.encode())
    file.flush()
    return file


def lock(file: BinaryIO) -> bool:
    """Lock `file` for this process without waiting; False if another process has it locked."""
    try:
        if fcntl is not None:
            fcntl.flock(file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        else:
            file.seek(LOCKED_BYTE)
            msvcrt.locking(file.fileno(), msvcrt.LK_NBLCK, 1)
    except OSError as err:
        if err.errno not in (errno.EAGAIN, errno.EACCES, errno.EDEADLK):  # held by another
            raise
        return False
    return True


def release(file: BinaryIO) -> None:
    """Let go of hold()'s file, emptied: the next run finds no one named in it."""
    with contextlib.suppress(OSError):
        file.truncate(0)
    file.close()  # the lock goes with it
