"""What the scripts share: seeding, the device, the models, the training loop, checkpoints, and
MNIST in memory; docs/using-common.md shows them in a project of your own. Copy the whole file
(it imports nothing else of this repo), or paste set_seed, get_device, MLP, CNN, train_one_epoch
or evaluate alone into a file that starts with these imports:

    import math, random
    from collections.abc import Callable, Iterable, Sequence
    import torch
    from torch import nn
"""

import contextlib
import io
import math
import os
import pickle
import random
import sys
import time
import zipfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

import torch
from torch import nn


# reproducibility and the device ---------------------------------------------------------------
def set_seed(seed: int) -> torch.Generator:
    """Seed Python's `random` and PyTorch (CPU and every accelerator); return a CPU generator."""
    random.seed(seed)
    torch.manual_seed(seed)  # the CPU's and every accelerator's: weights, dropout, randperm
    ## Give the generator to DataLoader(generator=...): the shuffled order and the workers'
    ## seeds then depend on `seed` alone, not on the random numbers the code before drew.
    return torch.Generator().manual_seed(seed)


def get_device(name: str = "auto") -> torch.device:
    """Return torch.device(name); "auto" picks the available accelerator, else the CPU."""
    ## torch.accelerator covers CUDA, ROCm, Apple MPS and Intel XPU: one script runs on all.
    found = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    if name == "auto":
        return found or torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"unknown device {name!r}: use auto, cpu, cuda, mps or xpu") from None
    if device.type == "cpu":  # one CPU device: "cpu:0" is the same, and torch.load refuses it
        return torch.device("cpu")
    count = torch.accelerator.device_count() if found and found.type == device.type else 0
    if (device.index or 0) >= count:  # the usual causes: a CPU-only PyTorch, or no driver
        build = "ROCm" if torch.version.hip else "CUDA" if torch.version.cuda else "the CPU only"
        raise ValueError(f"device {name!r} is not available ({count} {device.type} devices; this "
                         f"PyTorch is built for {build}; nvidia-smi lists GPUs): use cpu or auto")
    return device


# models ---------------------------------------------------------------------------------------
## A model is an nn.Module: __init__ creates its layers, whose weights model.parameters() then
## finds and model.to(device) moves, and forward() runs them.
## Each layer starts uniformly within +-1/sqrt(its inputs), which suits small networks.
class MLP(nn.Module):
    """Fully connected network for 1x28x28 images, 784-128-64-10 by default; returns logits."""

    def __init__(self, hidden: Sequence[int] = (128, 64), num_classes: int = 10) -> None:
        super().__init__()
        sizes = [28 * 28, *hidden, num_classes]
        ## One layer per pair of sizes, as attributes fc1, fc2, ... (a layer assigned to self is
        ## registered: its weights are found, and saved as fc1.weight, ...), in this order.
        for i in range(1, len(sizes)):
            setattr(self, f"fc{i}", nn.Linear(sizes[i - 1], sizes[i]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(1)  # [batch, 1, 28, 28] -> [batch, 784]
        *hidden, last = self.children()  # fc1, fc2, ..., in the order they were assigned
        for layer in hidden:
            x = torch.relu(layer(x))
        return last(x)  # no ReLU after the last layer: its outputs are the logits


class CNN(nn.Module):
    """Two conv+ReLU+max-pool blocks and two linear layers for 1x28x28 images; returns logits."""

    def __init__(self, channels: Sequence[int] = (16, 32), hidden: int = 128,
                 num_classes: int = 10) -> None:
        super().__init__()
        c1, c2 = channels
        self.conv1 = nn.Conv2d(1, c1, kernel_size=3, padding=1)  # 28x28 -> pool -> 14x14
        self.conv2 = nn.Conv2d(c1, c2, kernel_size=3, padding=1)  # 14x14 -> pool -> 7x7
        self.dropout = nn.Dropout(0.25)  # zeroes a random quarter of its inputs in training
        self.fc1 = nn.Linear(c2 * 7 * 7, hidden)
        self.fc2 = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ## Convolutions reuse the same small filters at every position, so a stroke is found
        ## wherever it is; pooling halves the resolution and adds a little shift tolerance.
        x = torch.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = torch.max_pool2d(torch.relu(self.conv2(x)), 2)
        x = self.dropout(x.flatten(1))
        return self.fc2(torch.relu(self.fc1(x)))


MODELS = {"mlp": MLP, "cnn": CNN}


def build_model(name: str, **sizes) -> nn.Module:
    """Return a freshly initialised model by name ("mlp" or "cnn"), with optional sizes."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}")
    return MODELS[name](**sizes)


# the training loop ----------------------------------------------------------------------------
def train_one_epoch(model: nn.Module, loader: Iterable, criterion: nn.Module,
                    optimizer: torch.optim.Optimizer, device: torch.device | str, *,
                    epoch: int = 1, log_interval: int = 200, amp_dtype: torch.dtype | None = None,
                    scaler: torch.amp.GradScaler | None = None, clip_grad: float | None = None,
                    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
                    log: Callable[[str], None] | None = print) -> float:
    """Train one pass over `loader`; return the mean loss per sample (of every process's, under
    torchrun). Per batch, in this order: zero_grad, forward, loss, backward, step."""
    device = torch.device(device)
    model.train()  # Dropout and BatchNorm behave as in training; evaluate() switches them back
    scaler = scaler or torch.amp.GradScaler(device.type, enabled=False)  # None: a no-op one
    ## The loss summed over samples, and their count, so far; `logged`: both at the last log.
    total, seen, logged = torch.zeros((), device=device), 0, (0.0, 0)
    batches = len(loader) if hasattr(loader, "__len__") else "?"  # a generator has no length
    for batch, (inputs, targets) in enumerate(loader, start=1):
        inputs, targets = inputs.to(device), targets.to(device)  # no copy if already there
        optimizer.zero_grad(set_to_none=True)  # backward() *adds* to .grad; None: no zeros written
        ## forward, then the loss; with amp_dtype, autocast runs the matmuls in 16 bits (AMP).
        with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            loss = criterion(model(inputs), targets)
        ## backward: each weight's .grad gets d(loss)/d(weight). (float16's range is narrow: an
        ## enabled scaler multiplies the loss first, so that small gradients do not become 0.)
        scaler.scale(loss).backward()  # disabled (no --amp fp16): just loss.backward()
        if clip_grad is not None:  # cap their joint norm: one bad batch cannot undo training
            scaler.unscale_(optimizer)  # the true gradients, not the scaled ones
            nn.utils.clip_grad_norm_(model.parameters(), clip_grad)
        ## step: move each weight against its gradient. step() before backward(), or
        ## zero_grad() between them, raises no error: the model just never learns.
        scaler.step(optimizer)  # optimizer.step(); float16: skipped if a gradient overflowed
        scaler.update()  # disabled: does nothing
        if scheduler is not None:
            scheduler.step()  # per batch, for warmup + cosine; not for StepLR, which counts epochs
        ## A per-sample sum (batch mean x size), kept on the device: .item() would make the CPU
        ## wait for the GPU. detach(): the graph behind the loss can be freed.
        total.add_(loss.detach(), alpha=len(targets))
        seen += len(targets)
        if log is not None and batch % log_interval == 0:
            interval = (total.item() - logged[0]) / (seen - logged[1])
            log(f"Epoch {epoch} | Batch {batch}/{batches} | Loss {interval:.4f}")
            logged = (total.item(), seen)
    if seen == 0:
        raise ValueError("the training loader produced no batches: is the dataset empty?")
    if torch.distributed.is_available() and torch.distributed.is_initialized():  # torchrun:
        sums = torch.tensor([total.item(), seen], dtype=torch.float64, device=device)
        torch.distributed.all_reduce(sums)  # every process's loss sum and count, added up
        total, seen = sums[0], int(sums[1])
    if not math.isfinite(average := total.item() / seen):
        raise FloatingPointError(f"the training loss became {average} in epoch {epoch}: try a 10x"
                                 " lower learning rate or clipping; check inputs for NaN or inf.")
    return average


def evaluate(model: nn.Module, loader: Iterable, criterion: nn.Module, device: torch.device | str,
             *, amp_dtype: torch.dtype | None = None) -> tuple[float, float]:
    """Return (average loss per sample, accuracy) of `model` on `loader`, without training it."""
    device = torch.device(device)
    model.eval()  # Dropout off; BatchNorm uses its running statistics
    total_loss, correct, seen = torch.zeros((), device=device), 0, 0
    ## inference_mode: no graph is recorded for a backward() that never comes (less memory).
    with torch.inference_mode(), torch.autocast(device.type, amp_dtype, amp_dtype is not None):
        for inputs, targets in loader:
            inputs, targets = inputs.to(device), targets.to(device)
            outputs = model(inputs)
            if outputs.dim() != 2 or targets.shape != outputs.shape[:1]:  # else argmax misleads
                raise ValueError(f"evaluate() needs outputs [batch, classes] and class numbers "
                                 f"[batch], not {list(outputs.shape)} and {list(targets.shape)}")
            total_loss += criterion(outputs, targets).float() * len(targets)
            correct += (outputs.argmax(dim=1) == targets).sum()  # the largest logit is the guess
            seen += len(targets)
    if seen == 0:
        raise ValueError("the evaluation loader produced no batches: is the dataset empty?")
    return total_loss.item() / seen, int(correct) / seen


# checkpoints ----------------------------------------------------------------------------------
## A checkpoint stores the weights by layer name (the state_dict), not the pickled model, so it
## loads into the model class in code; with them, what inference needs (model name, mean, std).
class CheckpointError(ValueError):
    """A checkpoint that is missing, damaged, unsafe to load, or made for another model."""


class OutputError(Exception):
    """A file that could not be written: a bad path, a full disk, an I/O error."""


def save_checkpoint(path: str | Path, model: nn.Module, *, model_name: str, mean: float,
                    std: float, epoch: int, val_accuracy: float, **extra) -> None:
    """Write the weights of `model` and what is needed to rebuild and use it to `path`, all or
    nothing. `extra`: more plain values to keep with it."""
    if isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
        model = model.module  # its state_dict's keys would start with "module."
    model = getattr(model, "_orig_mod", model)  # torch.compile(model) keeps the model there
    buffer = io.BytesIO()  # in memory first: checked below, then written whole or not at all
    torch.save({"model_name": model_name, "state_dict": model.state_dict(), "mean": float(mean),
                "std": float(std), "epoch": int(epoch), "val_accuracy": float(val_accuracy),
                **extra}, buffer)
    try:  # what load_checkpoint would refuse (a Path, an argparse Namespace): refused now
        torch.load(io.BytesIO(buffer.getvalue()), weights_only=True)
    except pickle.UnpicklingError as err:
        raise TypeError(f"save_checkpoint keeps numbers, strings, lists, dicts and tensors only: "
                        f"this one holds {str(err).split('GLOBAL ')[-1].split()[0]}: convert it "
                        "(str(path), vars(args))") from None
    write_atomically(path, buffer.getvalue())


def write_atomically(path: str | Path, data: bytes) -> None:
    """Replace the file `path` by `data`: afterwards it holds the old bytes or the new, whole."""
    real = Path(os.path.realpath(path))  # through a symlink: replace the file it points to
    tmp = temporary_name(real)  # a hidden file beside it, written first, then renamed over it
    try:
        if real.exists() and not real.is_file():  # a folder, /dev/null, a FIFO: never replaced
            raise OutputError(f"{path} is not a regular file, and will not be replaced")
        real.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            f.write(data)
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
    """The hidden name beside `path` that write_atomically writes first."""
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict:
    """Read a checkpoint written by save_checkpoint, refusing anything that could run code."""
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
    needed = ("model_name", "state_dict", "mean", "std")
    if not isinstance(checkpoint, dict) or not all(key in checkpoint for key in needed):
        raise CheckpointError(f"{path} is a PyTorch file but not a checkpoint of this repo: it "
                              f"needs the keys {', '.join(needed)} (save it with save_checkpoint)")
    return checkpoint


def load_model(path: str | Path, device: str | torch.device = "cpu") -> tuple[nn.Module, dict]:
    """Rebuild the checkpoint's model and load its weights; return (model, checkpoint)."""
    checkpoint = load_checkpoint(path, map_location=device)
    try:
        model = build_model(checkpoint["model_name"], **checkpoint.get("sizes", {}))
        model.load_state_dict(checkpoint["state_dict"])  # strict: every name and shape must match
    except (TypeError, ValueError, RuntimeError) as err:
        ## load_state_dict's message starts with a heading line; the next says what differs.
        lines = [line.strip() for line in str(err).splitlines() if line.strip()] or [""]
        raise CheckpointError(f"{path} does not fit the {checkpoint['model_name']!r} model that "
                              f"this code defines ({lines[len(lines) > 1].rstrip('. ')}): retrain "
                              "it, or restore the model code it was trained with") from None
    check_values(path, checkpoint, model)
    return model.to(device).eval(), checkpoint


def check_values(path: Path, checkpoint: dict, model: nn.Module) -> None:
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


# MNIST in memory ------------------------------------------------------------------------------
class DataError(ValueError):
    """Training data that cannot be used: missing or damaged files, labels out of range."""


MNIST_MEAN, MNIST_STD = 0.1307, 0.3081  # mean and std of MNIST training pixels scaled to 0..1


def load_mnist(data_dir: str | Path, train: bool = True,
               dataset: str = "MNIST") -> tuple[torch.Tensor, torch.Tensor]:
    """The images (uint8, N x 28 x 28) and labels (int64) of MNIST, or of another dataset in its
    format ("FashionMNIST"), from DATA_DIR/<dataset>/raw/ (safeguards.download_mnist fills it)."""
    ## Read here in milliseconds (see read_idx), without torchvision, whose import costs seconds.
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


def normalize_images(images: torch.Tensor, mean: float, std: float,
                     device: str | torch.device = "cpu") -> torch.Tensor:
    """Turn uint8 images (N x H x W) into float32 N x 1 x H x W on `device`, standardised."""
    ## Once for the whole dataset; the bytes travel first (4x less than float32), then convert.
    return images.to(device).unsqueeze(1).float().div_(255).sub_(mean).div_(std)


class TensorLoader:
    """Mini-batches cut from tensors in memory, used like a DataLoader; shuffled by seed + epoch."""

    ## A DataLoader calls dataset[i] once per sample and collates: flexible, but slow for a small
    ## model; data that fit in memory, as MNIST does, need one indexing per batch. Under torchrun
    ## a shuffled (training) loader gives each process every N-th sample of one shuffled order,
    ## padded so that every process has as many batches, as DistributedSampler does.

    def __init__(self, inputs: torch.Tensor, targets: torch.Tensor, batch_size: int,
                 shuffle: bool = False, seed: int = 0,
                 transform: Callable[[torch.Tensor, torch.Tensor], tuple] | None = None) -> None:
        if len(inputs) != len(targets):
            raise ValueError(f"{len(inputs)} inputs but {len(targets)} targets")
        self.inputs, self.targets, self.batch_size = inputs, targets, batch_size
        self.shuffle, self.seed = shuffle, seed
        self.transform, self.epoch = transform, 0  # transform: per batch, e.g. augmentation

    def set_epoch(self, epoch: int) -> None:
        """Shuffle with seed + epoch next time, as DistributedSampler.set_epoch does."""
        self.epoch = epoch

    def __len__(self) -> int:  # batches per epoch in this process
        n = len(self.targets)
        share = math.ceil(n / process_count()) if self.shuffle else n  # this process's samples
        return math.ceil(share / self.batch_size)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        n = len(self.targets)
        order = torch.arange(n)
        if self.shuffle:  # a new order every epoch, the same in every process
            generator = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.randperm(n, generator=generator)
            if (processes := process_count()) > 1:  # torchrun: this process's share, padded
                order = order.repeat(processes)[: -(-n // processes) * processes]
                order = order[process_rank() :: processes]
        order = order.to(self.inputs.device)  # one small copy
        self.epoch += 1  # a caller that never calls set_epoch() still gets a new order next time
        for start in range(0, len(order), self.batch_size):
            idx = order[start : start + self.batch_size]
            batch = self.inputs.index_select(0, idx), self.targets.index_select(0, idx)
            yield batch if self.transform is None else self.transform(*batch)


def process_count() -> int:
    """How many processes train together: torchrun's number of them, or 1."""
    dist = torch.distributed
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def process_rank() -> int:
    """This process's number among them (its "rank"), from 0; 0 without torchrun."""
    return torch.distributed.get_rank() if process_count() > 1 else 0
