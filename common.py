"""What the scripts here share, in the order a lesson needs it.

    from common import evaluate, get_device, set_seed, train_one_epoch

    generator = set_seed(42)  # give it to DataLoader(..., shuffle=True, generator=generator)
    device = get_device()     # the GPU (CUDA, ROCm, MPS, XPU) when there is one, else the CPU
    for epoch in range(1, epochs + 1):
        train_loss = train_one_epoch(model, train_loader, criterion, optimizer, device, epoch=epoch)
        val_loss, val_acc = evaluate(model, val_loader, criterion, device)

The first half is the lesson: seeding, the device, the models, the training loop, checkpoints.
set_seed, get_device, MLP, CNN, train_one_epoch and evaluate each work when pasted alone into a
file that starts with these imports (tests/test_common.py pastes each one that way):

    import math
    import random
    from collections.abc import Callable, Iterable, Sequence

    import torch
    from torch import nn

The checkpoint functions lean on each other, on get_device (to check map_location) and on the
"writing files safely" section: copy those whole, or call torch.save and
torch.load(weights_only=True) yourself.

The second half is plumbing that the scripts share and a reader can skip: reading the MNIST
files, batches cut from tensors in memory, writing files safely, the scripts' --help, and
torchrun.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import errno
import io
import math
import os
import pickle
import random
import re
import secrets
import stat
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

import torch
from torch import nn

# ---------------------------------------------------------------------------------------------
# reproducibility


def set_seed(seed: int) -> torch.Generator:
    """Seed Python's `random` and PyTorch (CPU and every accelerator); return a CPU generator."""
    random.seed(seed)
    ## torch.manual_seed seeds the CPU *and* every accelerator's generator, so weight
    ## initialisation, dropout and torch.randperm repeat exactly from run to run.
    torch.manual_seed(seed)
    ## Give the returned generator to DataLoader(generator=...). The shuffling order, and the
    ## seeds of its worker processes (PyTorch seeds `random`, torch and, when installed, NumPy
    ## in each worker from it),
    ## then do not depend on how much randomness the code before used: a model with one more
    ## layer would otherwise change the data order.
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------------------------------------
# device


def get_device(name: str = "auto") -> torch.device:
    """Return torch.device(name); "auto" picks the available accelerator, else the CPU."""
    ## torch.accelerator covers CUDA, ROCm, Apple MPS and Intel XPU with one API, so the same
    ## script runs on all of them. "cpu" skips the query (and the GPU stack) altogether.
    if name == "auto":
        if torch.accelerator.is_available():
            return torch.accelerator.current_accelerator()
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError as err:
        raise ValueError(f"unknown device {name!r}: use auto, cpu, cuda, cuda:1, mps or "
                         "xpu") from err
    if device.type == "cpu":  # one CPU device: "cpu:0" is the same, and torch.load refuses it
        return torch.device("cpu")
    found = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    if found is None or found.type != device.type:
        hint = ""
        if device.type == "cuda":  # the two usual causes: a CPU-only wheel, or no driver
            build = ("built for ROCm" if torch.version.hip else "built for CUDA"
                     if torch.version.cuda else "a CPU-only build")
            hint = (f" This PyTorch ({torch.__version__}) is {build}; `nvidia-smi` (or "
                    "`rocm-smi`) shows whether a driver and a GPU are visible.")
        raise ValueError(f"device {name!r} is not available here (accelerator found: "
                         f"{found.type if found else 'none'}); use 'cpu' or 'auto'.{hint}")
    if device.index is not None and device.index >= torch.accelerator.device_count():
        raise ValueError(f"device {name!r} does not exist: this machine has "
                         f"{torch.accelerator.device_count()} {device.type} device(s)")
    return device


# ---------------------------------------------------------------------------------------------
# models
## A model is an nn.Module: layers with weights are created in __init__, which registers their
## parameters (model.parameters() finds them, model.to(device) moves them); forward() says how
## data flows through them. PyTorch initialises each layer's weights as it is built, uniformly
## within +-1/sqrt(inputs per unit), which works well for small networks like these
## (synthetic_train.py shows how to choose an initialisation yourself). Both return "logits":
## one raw score per class, any real number, higher for the likelier class. Neither ends in a
## softmax (which would turn them into probabilities): nn.CrossEntropyLoss applies log-softmax
## itself, and a second softmax would squash the logits and slow learning.


class MLP(nn.Module):
    """Fully connected network for 1x28x28 images, 784-128-64-10 by default; returns logits."""

    def __init__(self, hidden: Sequence[int] = (128, 64), num_classes: int = 10) -> None:
        super().__init__()
        sizes = [28 * 28, *hidden, num_classes]
        ## One nn.Linear per pair of neighbouring sizes, named fc1, fc2, ...: setattr registers
        ## each exactly as `self.fc1 = nn.Linear(784, 128)` would, so the state_dict keys are
        ## fc1.weight, fc1.bias, ... whatever the depth (an nn.Sequential would name them 0, 2,
        ## ...). The parameter count follows the sizes; for the default ones it is
        ## (784 + 1) x 128 + (128 + 1) x 64 + (64 + 1) x 10 = 109,386.
        for i, (n_in, n_out) in enumerate(zip(sizes, sizes[1:]), start=1):
            setattr(self, f"fc{i}", nn.Linear(n_in, n_out))
        self.layers = len(sizes) - 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(1)  # [batch, 1, 28, 28] -> [batch, 784]: an MLP sees a flat vector
        for i in range(1, self.layers):
            x = torch.relu(getattr(self, f"fc{i}")(x))  # ReLU: no weights, a plain function
        return getattr(self, f"fc{self.layers}")(x)  # raw scores (logits), one per class


class CNN(nn.Module):
    """Two conv+ReLU+max-pool blocks and two linear layers for 1x28x28 images; returns logits."""

    def __init__(self, channels: Sequence[int] = (16, 32), hidden: int = 128,
                 num_classes: int = 10) -> None:
        super().__init__()
        c1, c2 = channels
        self.conv1 = nn.Conv2d(1, c1, kernel_size=3, padding=1)  # 28x28 -> pool -> 14x14
        self.conv2 = nn.Conv2d(c1, c2, kernel_size=3, padding=1)  # 14x14 -> pool -> 7x7
        ## Dropout zeroes a random quarter of its inputs at each training step (and scales up the
        ## rest), so the next layer cannot lean on any single feature. Off in model.eval().
        self.dropout = nn.Dropout(0.25)
        self.fc1 = nn.Linear(c2 * 7 * 7, hidden)
        self.fc2 = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ## Convolutions reuse the same small filters at every position, so a stroke is recognised
        ## wherever it is; pooling halves the resolution and adds a little shift tolerance.
        x = torch.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = torch.max_pool2d(torch.relu(self.conv2(x)), 2)
        x = self.dropout(x.flatten(1))
        x = torch.relu(self.fc1(x))
        return self.fc2(x)


MODELS = {"mlp": MLP, "cnn": CNN}


def build_model(name: str, **sizes) -> nn.Module:
    """Return a freshly initialised model by name ("mlp" or "cnn"), with optional sizes."""
    ## mnist_train.py's checkpoints store the name and the sizes (save_checkpoint's sizes=), so
    ## predict.py rebuilds exactly what was trained.
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}")
    return MODELS[name](**sizes)


# ---------------------------------------------------------------------------------------------
# the training loop


def train_one_epoch(model: nn.Module, loader: Iterable, criterion: nn.Module,
                    optimizer: torch.optim.Optimizer, device: torch.device | str, *,
                    epoch: int = 1, log_interval: int = 200, amp_dtype: torch.dtype | None = None,
                    scaler: torch.amp.GradScaler | None = None, clip_grad: float | None = None,
                    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
                    log: Callable[[str], None] | None = print) -> float:
    """Train one pass over `loader`; return the mean loss per sample (criterion: a batch mean)."""
    device = torch.device(device)
    model.train()  # Dropout and BatchNorm behave as in training; evaluate() switches them back
    total, seen, logged = torch.zeros((), device=device), 0, (0.0, 0)  # sums: now, at last log
    batches = len(loader) if hasattr(loader, "__len__") else "?"  # a generator has no length
    for batch, (inputs, targets) in enumerate(loader, start=1):
        inputs, targets = inputs.to(device), targets.to(device)  # no copy if already there
        ## 1. Clear the old gradients: backward() *adds* to .grad, it does not overwrite it.
        optimizer.zero_grad(set_to_none=True)  # None, not zeros: nothing to write, less memory
        ## 2-3. Forward pass and loss; with amp_dtype, autocast runs matmuls in 16 bits (AMP).
        with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            loss = criterion(model(inputs), targets)
        if scaler is None:  # float32 or bfloat16: the plain steps that every tutorial shows
            ## 4. Backward: fill each .grad with d(loss)/d(param).
            loss.backward()
            ## 5. Optional: if the gradients' joint norm exceeds clip_grad, shrink them (spikes).
            if clip_grad is not None:
                nn.utils.clip_grad_norm_(model.parameters(), clip_grad)
            ## 6. Update the weights. step() before backward(), or zero_grad() between them, raises
            ##    no error: the model just never learns. That is why the order matters.
            optimizer.step()
        else:  # float16: steps 4-6 go through a GradScaler, as float16's range is narrow
            scaler.scale(loss).backward()  # loss x a big factor: small gradients stay above 0
            if clip_grad is not None:
                scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
                nn.utils.clip_grad_norm_(model.parameters(), clip_grad)
            scaler.step(optimizer)  # divides the factor out; skipped if gradients overflowed
            scaler.update()  # a smaller scale after an overflow, a larger one after many steps
        if scheduler is not None:
            scheduler.step()  # a per-batch learning-rate schedule, such as warmup + cosine
        ## The batch's mean loss x its size: a per-sample sum. detach() lets each graph be freed.
        total.add_(loss.detach(), alpha=len(targets))  # in place: no new tensor per batch
        seen += len(targets)
        if log is not None and batch % log_interval == 0:  # .item() makes the CPU wait for GPU
            interval = (total.item() - logged[0]) / (seen - logged[1])
            log(f"Epoch {epoch} | Batch {batch}/{batches} | Loss {interval:.4f}")
            logged = (total.item(), seen)
    if seen == 0:
        raise ValueError("the training loader produced no batches: is the dataset empty?")
    if not math.isfinite(average := total.item() / seen):
        raise FloatingPointError(f"the training loss became {average} in epoch {epoch}: try a "
                                 "10x lower learning rate or gradient clipping, and check the "
                                 "inputs for NaN or inf. The weights are likely ruined.")
    return average


def evaluate(model: nn.Module, loader: Iterable, criterion: nn.Module,
             device: torch.device | str, *, amp_dtype: torch.dtype | None = None,
             ) -> tuple[float, float]:
    """Return (average loss per sample, accuracy) of `model` on `loader`, without training it."""
    device = torch.device(device)
    ## eval() switches Dropout off and makes BatchNorm use its running statistics. inference_mode
    ## (a stricter, faster no_grad) records no autograd graph: no memory is kept for a backward
    ## pass that will never happen, and no .grad is touched.
    model.eval()
    total_loss, correct, seen = torch.zeros((), device=device), 0, 0
    with torch.inference_mode(), torch.autocast(device.type, dtype=amp_dtype,
                                                enabled=amp_dtype is not None):
        for inputs, targets in loader:
            inputs, targets = inputs.to(device), targets.to(device)
            outputs = model(inputs)
            if outputs.dim() != 2 or targets.shape != outputs.shape[:1]:  # else argmax misleads
                raise ValueError(f"evaluate() needs outputs of shape [batch, classes] and targets "
                                 f"of class numbers [batch]; got {list(outputs.shape)} and "
                                 f"{list(targets.shape)}")
            total_loss += criterion(outputs, targets).float() * len(targets)
            correct += (outputs.argmax(dim=1) == targets).sum()  # the largest logit is the guess
            seen += len(targets)
    if seen == 0:
        raise ValueError("the evaluation loader produced no batches: is the dataset empty?")
    return total_loss.item() / seen, int(correct) / seen


# ---------------------------------------------------------------------------------------------
# checkpoints
## A checkpoint stores the state_dict (the weights, by layer name) and not the pickled model
## object: it loads into the model class defined in code, survives refactoring of everything
## else, and can be loaded with weights_only=True. It also stores what inference needs to rebuild
## and feed the model: the architecture's name and the normalisation that training used.


class CheckpointError(ValueError):
    """A checkpoint that is missing, damaged, unsafe to load, or made for another model."""


## The first bytes of common picture formats: a picture given as a checkpoint is named as one.
## (A WebP file is a RIFF container, as WAV and AVI files are: "WEBP" follows at byte 8.)
PICTURE_SIGNATURES = {b"\x89PNG": "PNG", b"\xff\xd8\xff": "JPEG", b"GIF8": "GIF",
                      b"BM": "BMP", b"RIFF": "WebP", b"II*\x00": "TIFF", b"MM\x00*": "TIFF"}


def save_checkpoint(path: str | Path, model: nn.Module, *, model_name: str, mean: float,
                    std: float, epoch: int, val_accuracy: float, **extra) -> None:
    """Write the model and what is needed to rebuild and use it to `path`, atomically.

    `extra`: more plain values to keep with it, such as the model's sizes (sizes={...}).
    """
    ## Unwrap DistributedDataParallel (.module) and `torch.compile(model)` (._orig_mod): their
    ## state_dict keys carry a prefix that a plain model would not recognise.
    if isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
        model = model.module
    model = getattr(model, "_orig_mod", model)
    checkpoint = {"model_name": model_name, "state_dict": model.state_dict(), "mean": float(mean),
                  "std": float(std), "epoch": int(epoch), "val_accuracy": float(val_accuracy),
                  **extra}
    buffer = io.BytesIO()
    torch.save(checkpoint, buffer)  # in memory first: a full disk is then an OSError we can name
    try:  # an object load_checkpoint would refuse (a Path, argparse's Namespace): say so now
        torch.load(io.BytesIO(buffer.getbuffer()), weights_only=True)
    except pickle.UnpicklingError as err:
        kind = re.search(r"GLOBAL (\S+)", str(err))
        raise TypeError(f"save_checkpoint keeps numbers, strings, lists, dicts and tensors only, "
                        f"which load_checkpoint reads safely; this one holds "
                        f"{kind[1] if kind else 'another object'}: convert it (str(path), "
                        f"vars(args))") from None
    write_atomically(path, buffer.getvalue())  # the old file stays whole if this fails


def damaged_part(path: str | Path) -> str | None:
    """The first part of a torch.save archive that no longer reads back as it was saved, or
    None: none (or no zip archive at all, for torch.load to explain)."""
    ## torch.save stores a CRC-32 checksum of each part of its zip archive (the pickle, each
    ## tensor's bytes), but torch.load does not check them: a file damaged on the way (a bad
    ## copy, a failing disk) loads with wrong weights and predicts nonsense without a word.
    ## zipfile checks each part as it reads it: a few milliseconds for this repo's models.
    try:
        archive = zipfile.ZipFile(path)
    except Exception:  # no archive that zipfile can read: torch.load will say what is wrong
        return None
    with archive:
        for part in archive.infolist():
            ## A checksum of 0: saved with torch's checksums off (set_crc32_options(False)).
            if part.CRC:
                try:
                    with archive.open(part) as f:
                        while f.read(1 << 20):  # a megabyte at a time, however big the part
                            pass
                except Exception:  # a wrong checksum, or a damaged header
                    return part.filename
    return None


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict:
    """Read a checkpoint written by save_checkpoint, refusing anything that could run code.
    In short: torch.load(path, weights_only=True); the rest turns each way a file can be wrong
    into a one-line message."""
    import warnings

    path = Path(path)
    try:
        if not path.is_file():
            what = ("is a directory" if path.is_dir() else "is not a regular file (a device, a "
                    "pipe)" if path.exists() else "does not exist")
            raise CheckpointError(f"checkpoint {path} {what}")
        if path.stat().st_size == 0:
            raise CheckpointError(f"checkpoint {path} is empty (0 bytes): it was not saved "
                                  "completely")
        with open(path, "rb") as f:
            start = f.read(12)
    except OSError as err:  # a name too long, a file or folder this user may not read
        raise CheckpointError(f"checkpoint {path} cannot be read: {err.strerror or err}"
                              ) from None
    for signature, kind in PICTURE_SIGNATURES.items():
        if start.startswith(signature) and (kind != "WebP" or start[8:12] == b"WEBP"):
            raise CheckpointError(f"{path} is a {kind} picture, not a checkpoint")
    ## torch.save writes a zip archive. Before PyTorch 1.6 (or with
    ## _use_new_zipfile_serialization=False) it wrote a bare pickle, starting with byte 0x80.
    if not start.startswith((b"PK\x03\x04", b"\x80")):
        text = all(32 <= byte < 127 or byte in b"\t\n\r" for byte in start)
        raise CheckpointError(f"{path} is not a PyTorch checkpoint ("
                              + ("it is text)" if text else "torch.save did not write it)"))
    try:  # a device this machine has: else torch.load would fail as if the file were bad
        get_device(str(map_location))
    except ValueError:
        raise CheckpointError(f"cannot load {path} onto {map_location}: PyTorch finds no such "
                              "device here (map_location='cpu' loads it on any machine)") from None
    if part := damaged_part(path):
        raise CheckpointError(f"{path} is damaged: its part {part} does not read back as it "
                              "was saved (torch.save keeps a checksum of each part), as after a "
                              "bad copy or on a failing disk. Use a good copy, or train again")
    try:
        ## weights_only=True unpickles only tensors and plain containers. A pickle can otherwise
        ## name any function to call while loading, so a downloaded .pt file could run code.
        with warnings.catch_warnings():  # no "unusual pickle protocol" chatter for bad files
            warnings.simplefilter("ignore", UserWarning)
            checkpoint = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        if "GLOBAL" in str(err):  # the pickle names a function or class to import and call
            raise CheckpointError(
                f"refused to load {path}: it contains Python objects, not just tensors and "
                "numbers, and loading it could run code. Only a checkpoint saved with "
                "save_checkpoint (a state_dict and plain values) is accepted") from err
        raise CheckpointError(f"{path} is not a PyTorch checkpoint") from err
    except Exception as err:  # a damaged file can make the unpickler fail in many ways
        raise CheckpointError(f"{path} is not a readable PyTorch checkpoint, or it is truncated "
                              f"({first_sentence(err)})") from err
    needed = ("model_name", "state_dict", "mean", "std")
    if not isinstance(checkpoint, dict) or not all(k in checkpoint for k in needed):
        values = checkpoint.values() if isinstance(checkpoint, dict) else [None]
        if values and all(isinstance(v, torch.Tensor) for v in values):
            raise CheckpointError(f"{path} holds a bare state_dict. A checkpoint that "
                                  "save_checkpoint writes also records the model name and "
                                  "normalisation: save it with save_checkpoint")
        if isinstance(checkpoint, dict) and {"optimizer", "settings"} <= checkpoint.keys():
            beside = (f", {path.with_name(path.name.removesuffix('_resume.pt') + '.pt')}"
                      if path.name.endswith("_resume.pt") else "")
            raise CheckpointError(f"{path} is a training state, for going on with an "
                                  f"interrupted run (an optimizer and settings), not a model: "
                                  f"give the model saved beside it{beside}")
        raise CheckpointError(f"{path} is a PyTorch file but not a checkpoint that "
                              f"save_checkpoint wrote (it needs the keys {', '.join(needed)})")
    return checkpoint


def load_model(path: str | Path, device: str | torch.device = "cpu") -> tuple[nn.Module, dict]:
    """Rebuild the checkpoint's model and load its weights; return (model, checkpoint)."""
    checkpoint = load_checkpoint(path, map_location=device)
    name = checkpoint["model_name"]
    if name not in MODELS:
        raise CheckpointError(f"{path} was saved for a model named {name!r}, which this code does "
                              f"not define (known: {', '.join(MODELS)})")
    try:  # the sizes trained with; a checkpoint saved before sizes were recorded has none
        model = build_model(name, **checkpoint.get("sizes", {}))
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"{path} records model sizes this code cannot build: "
                              f"{checkpoint.get('sizes')} ({first_line(err)})") from err
    try:
        model.load_state_dict(checkpoint["state_dict"])  # strict: every name and shape must match
    except RuntimeError as err:
        raise CheckpointError(
            f"{path} does not fit the {name!r} model that this code defines "
            f"({first_detail(err)}). It was trained with a different "
            "architecture: retrain it, or restore the model code it was trained with") from err
    ## A checkpoint made by hand, or by other code, can hold values that would only fail later,
    ## one picture at a time: a std of 0 divides by zero, a short list of class names.
    mean, std, classes = checkpoint["mean"], checkpoint["std"], checkpoint.get("classes")
    if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in (mean, std)) or std <= 0:
        raise CheckpointError(f"{path} records a normalisation that cannot be used (mean {mean!r}, "
                              f"std {std!r}): both must be numbers, and the std above 0")
    outputs = checkpoint.get("sizes", {}).get("num_classes", 10)
    if classes is not None and (not isinstance(classes, (list, tuple)) or len(classes) != outputs
                                or not all(isinstance(c, str) for c in classes)):
        raise CheckpointError(f"{path} records {classes!r} as its classes: it needs a list of "
                              f"{outputs} names, one for each of the model's outputs")
    return model.to(device).eval(), checkpoint


def first_line(err: BaseException) -> str:
    """The first line of an exception's message (or its type's name), for one-line errors."""
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


def first_detail(err: BaseException) -> str:
    """What load_state_dict's error says first, below its heading line ("Error(s) in loading
    state_dict for MLP:"): the missing key, or the size that differs. Else the first line."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return (lines[1] if len(lines) > 1 else first_line(err)).rstrip(". ")


def sentence(text: str) -> str:
    """`text` ending in a full stop, unless it already ends in one (or in ? or !)."""
    return text if text.endswith((".", "?", "!")) else text + "."


def first_sentence(err: BaseException) -> str:
    """The first sentence of an exception's first line, without its final full stop."""
    line = first_line(err)
    return line.split(". ")[0].rstrip(".")


# =============================================================================================
# Plumbing: what the scripts share beyond the lesson. Nothing above depends on it, except
# save_checkpoint on write_atomically.
# =============================================================================================

# ---------------------------------------------------------------------------------------------
# MNIST files and in-memory batches


class DataError(ValueError):
    """Training data that cannot be used: missing or damaged MNIST files, labels out of range."""


MNIST_MEAN, MNIST_STD = 0.1307, 0.3081  # mean and std of MNIST training pixels scaled to 0..1
MNIST_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
               "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


def load_mnist(data_dir: str | Path, train: bool, download: bool = True,
               dataset: str = "MNIST") -> tuple[torch.Tensor, torch.Tensor]:
    """Return MNIST images (uint8, N x 28 x 28) and labels (int64), downloading on first use.

    `dataset` is torchvision's name of an MNIST-format dataset: "MNIST" or "FashionMNIST".
    """
    ## The four files are in the IDX format: a short header (magic number, then the size of
    ## each dimension), then one byte per pixel or label. Reading them takes a few lines and
    ## milliseconds; torchvision is imported only to download missing files (its import alone
    ## costs seconds).
    raw = Path(data_dir) / dataset / "raw"
    prefix = "train" if train else "t10k"
    images_file = raw / f"{prefix}-images-idx3-ubyte"
    labels_file = raw / f"{prefix}-labels-idx1-ubyte"
    try:  # a file or folder this user may not read, a folder where a file belongs: one line
        for folder in (Path(data_dir), *Path(data_dir).parents):  # the deepest one there
            if folder.exists():
                if not folder.is_dir():
                    raise DataError(f"the data folder {data_dir} cannot be used: {folder} is a "
                                    "file")
                break
        for name in MNIST_FILES:
            if (raw / name).exists() and (problem := _idx_problem(raw / name)):
                raise DataError(f"{raw / name} is damaged ({problem}). Delete it, and its .gz "
                                "if there is one, then run again to download it afresh.")
        if not all((raw / name).exists() for name in MNIST_FILES):
            if hint := _misplaced(Path(data_dir), dataset):
                raise DataError(f"{dataset} is not in {raw}/, but {hint}")
            if not download:
                raise DataError(f"{dataset} is not in {raw}/ and downloading is switched off")
            _download(data_dir, dataset, raw)
        images, labels = read_idx(images_file), read_idx(labels_file).long()
    except OSError as err:
        raise DataError(f"{err.filename or raw} cannot be read: {err.strerror or err}") from err
    if images.dim() != 3 or images.shape[1:] != (28, 28) or labels.dim() != 1:
        raise DataError(f"{images_file} holds images of shape {list(images.shape)} and "
                        f"{labels_file} labels of shape {list(labels.shape)}, where N x 28 x 28 "
                        "and N are expected: are these the files of another dataset?")
    if len(images) != len(labels):
        raise DataError(f"{images_file} holds {len(images):,} images but {labels_file} "
                        f"{len(labels):,} labels: they come from different copies. Delete both, "
                        "and their .gz, then run again.")
    if len(images) == 0:
        raise DataError(f"{images_file} holds no images: delete it and {labels_file}, and "
                        "their .gz, then run again")
    check_labels(labels, 10, where=str(labels_file))
    return images, labels


def read_idx(path: str | Path) -> torch.Tensor:
    """Read an IDX file of bytes (MNIST's format) into a uint8 tensor of the shape it states."""
    if problem := _idx_problem(Path(path)):  # before trusting the sizes its header states
        raise DataError(f"{path} is damaged ({problem})")
    with open(path, "rb") as f:
        shape = _idx_shape(f)
        data = bytearray(math.prod(shape))
        f.readinto(data)  # straight into the buffer the tensor will use: no second copy
    ## torch.frombuffer refuses an empty buffer: a file of 0 images gets an empty tensor.
    return torch.frombuffer(data, dtype=torch.uint8).view(shape) if data else torch.zeros(
        shape, dtype=torch.uint8)


def _misplaced(data_dir: Path, dataset: str) -> str | None:
    """Where the dataset's files are when data_dir is not the folder that holds DATASET/raw/."""
    for folder in (data_dir / "raw", data_dir):  # data_dir = data/MNIST or data/MNIST/raw
        if all((folder / name).exists() or (folder / f"{name}.gz").exists()
               for name in MNIST_FILES):
            if folder.name == "raw":
                return (f"its files are in {folder}/: give {folder.parent.parent} as the data "
                        f"folder, the one that holds {dataset}/raw/.")
            return f"its files are in {folder}/: move them to {data_dir / dataset / 'raw'}/."
    return None


def _download(data_dir: str | Path, dataset: str, raw: Path) -> None:
    """Fetch and unpack the missing files with torchvision, which checks their checksums."""
    import socket

    from torchvision import datasets  # only now: its import alone takes seconds

    old_timeout = socket.getdefaulttimeout()
    socket.setdefaulttimeout(30)  # a blocked network fails after 30 s instead of hanging
    new_folders = [f for f in (raw, *raw.parents) if not f.exists()]  # deepest first
    try:
        getattr(datasets, dataset)(root=data_dir, download=True)
    except (RuntimeError, OSError) as err:  # offline, blocked mirror, bad .gz, disk full
        for folder in new_folders:  # no empty folders left behind, e.g. by a typo in the path
            try:
                folder.rmdir()  # only if it is empty
            except OSError:
                break
        for name, md5 in getattr(datasets, dataset).resources:
            gz = raw / name
            if gz.exists() and not datasets.utils.check_integrity(str(gz), md5):
                raise DataError(f"{gz} is damaged (its checksum is wrong) and no fresh copy "
                                "could be downloaded. Delete it and run again with internet "
                                "access, or put a good copy there. A good copy compressed "
                                "differently (as Linux distributions' packages are) can be "
                                "unpacked there instead, e.g. with gunzip -k.") from err
        missing = [n for n in MNIST_FILES if not (raw / n).exists()]
        raise DataError(
            f"{dataset} is not in {raw}/ (missing: {', '.join(missing)}) and downloading it "
            f"failed: {download_reason(err)}. Run once with internet access, or put the missing "
            f"files into {raw}/, unpacked and named as above (a .gz copy works only if it is "
            "the one torchvision downloads; others, such as a Linux package's, fail its "
            "checksum: gunzip them there).") from err
    finally:
        socket.setdefaulttimeout(old_timeout)


def download_reason(err: BaseException) -> str:
    """The cause of a failed torchvision download, in one line."""
    ## torchvision's message is "Error downloading X:" followed by one "Tried <mirror>, got:"
    ## line and the error per mirror: the last line is the last mirror's reason.
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return lines[-1].rstrip(".") if lines else type(err).__name__


def _idx_problem(path: Path) -> str | None:
    """Say what is wrong with an IDX file (MNIST's format), or return None if it looks whole."""
    with open(path, "rb") as f:
        shape = _idx_shape(f)
        header = f.tell()
    if isinstance(shape, str):
        return shape
    expected, size = header + math.prod(shape), path.stat().st_size
    if size != expected:
        return f"{size:,} bytes where its header promises {expected:,}: truncated or padded"
    return None


def _idx_shape(f) -> list[int] | str:
    """Read an IDX header from the open file `f`: the shape it states, or what is wrong."""
    magic = f.read(4)
    ## Magic number: two zero bytes, 0x08 (unsigned bytes), then the number of dimensions.
    if len(magic) < 4 or magic[:3] != b"\x00\x00\x08" or not 1 <= magic[3] <= 3:
        return "not an IDX file of bytes: wrong magic number"
    dims = f.read(4 * magic[3])  # each dimension's size: 4 bytes, most significant first
    if len(dims) < 4 * magic[3]:
        return "truncated inside its header"
    return [int.from_bytes(dims[i : i + 4], "big") for i in range(0, len(dims), 4)]


def check_labels(labels: torch.Tensor, num_classes: int, where: str = "the labels") -> None:
    """Raise DataError unless every label is a class index in 0..num_classes-1."""
    ## Check once, where the data is loaded, not on every batch. nn.CrossEntropyLoss needs class
    ## indices 0..C-1: labels 1..10 fail on the CPU with "Target 10 is out of bounds", and on a
    ## GPU with an unreadable "device-side assert" that names no sample.
    bad = ((labels < 0) | (labels >= num_classes)).nonzero()
    if len(bad):
        i = int(bad[0])
        raise DataError(f"label {int(labels[i])} at position {i} of {where} is outside "
                        f"0..{num_classes - 1}. Class labels must be integers from 0 to "
                        f"{num_classes - 1}: remap them (for example 1..10 -> 0..9), or give the "
                        "model one output per class.")


def normalize_images(images: torch.Tensor, mean: float, std: float,
                     device: str | torch.device = "cpu") -> torch.Tensor:
    """Turn uint8 images (N x H x W) into float32 N x 1 x H x W on `device`, standardised."""
    ## Done once for the whole dataset instead of once per sample per epoch: this is the work that
    ## ToTensor() + Normalize() repeat inside a DataLoader. Move the uint8 bytes first (4x less to
    ## copy than float32), then convert on the device, in place, so only one float copy exists.
    x = images.to(device).unsqueeze(1).float()
    return x.div_(255).sub_(mean).div_(std)


class TensorLoader:
    """Mini-batches cut from tensors already in memory (shuffled with shuffle=True), used like
    a DataLoader."""

    ## A DataLoader calls dataset[i] once per sample and collates the results: flexible (files on
    ## disk, random augmentation per sample) but it spends far more time than a small model needs.
    ## When the whole dataset fits in memory, as MNIST does (47 MB as bytes), one indexing
    ## operation per batch does the same job. On a GPU the tensors live in GPU memory, and batches
    ## never cross the PCIe bus. With world_size > 1 each process (rank) takes every
    ## world_size-th sample of the order. Shuffled, the order is padded to a multiple of
    ## world_size first, exactly as DistributedSampler does; unshuffled (evaluation), it is not,
    ## so that every sample counts once.

    def __init__(self, inputs: torch.Tensor, targets: torch.Tensor, batch_size: int,
                 shuffle: bool = False, seed: int = 0, rank: int = 0, world_size: int = 1,
                 transform: Callable[[torch.Tensor, torch.Tensor], tuple] | None = None) -> None:
        if len(inputs) != len(targets):
            raise ValueError(f"{len(inputs)} inputs but {len(targets)} targets")
        self.inputs, self.targets, self.batch_size = inputs, targets, batch_size
        self.shuffle, self.seed, self.rank, self.world_size = shuffle, seed, rank, world_size
        self.transform = transform  # (inputs, targets) -> (inputs, targets), e.g. augmentation
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Shuffle with seed + epoch next time, as DistributedSampler.set_epoch does."""
        self.epoch = epoch

    def _local_order(self) -> torch.Tensor:
        n = len(self.targets)
        if self.shuffle:  # a fresh order every epoch, the same on every rank
            generator = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.randperm(n, generator=generator)
        else:
            order = torch.arange(n)
        if self.world_size > 1:
            if self.shuffle and n % self.world_size:  # training: all ranks get as many samples,
                total = math.ceil(n / self.world_size) * self.world_size  # wrapping around,
                order = order.repeat(math.ceil(total / n))[:total]  # as DistributedSampler does
            order = order[self.rank :: self.world_size]  # unshuffled (evaluation): no padding
        return order

    def __len__(self) -> int:  # batches per epoch on this rank
        n = len(self.targets)
        if self.shuffle:
            local = math.ceil(n / self.world_size)
        else:
            local = len(range(self.rank, n, self.world_size))
        return math.ceil(local / self.batch_size)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        order = self._local_order().to(self.inputs.device)  # one small copy per epoch
        self.epoch += 1  # if set_epoch() is never called, the next epoch still reshuffles
        for start in range(0, len(order), self.batch_size):
            idx = order[start : start + self.batch_size]
            ## index_select(0, idx) does what self.inputs[idx] does, faster
            batch = self.inputs.index_select(0, idx), self.targets.index_select(0, idx)
            yield batch if self.transform is None else self.transform(*batch)


# ---------------------------------------------------------------------------------------------
# writing files safely


class OutputError(Exception):
    """A result that cannot be written: a bad output path, a full disk, an I/O error."""


def output_file_problem(path: str | Path) -> str | None:
    """Say why `path` must not be replaced by a regular file, or return None if it may."""
    try:
        mode = os.stat(path).st_mode  # follows symlinks: a link to a device is a device
    except (FileNotFoundError, NotADirectoryError):  # nothing there yet
        return None
    except OSError as err:
        return f"cannot be inspected ({err.strerror})"
    if stat.S_ISDIR(mode):
        return "is a directory; give a file name inside it"
    if not stat.S_ISREG(mode):
        kind = ("a character device" if stat.S_ISCHR(mode) else "a block device"
                if stat.S_ISBLK(mode) else "a FIFO (named pipe)" if stat.S_ISFIFO(mode)
                else "a socket" if stat.S_ISSOCK(mode) else "not a regular file")
        return f"is {kind}, not a regular file, and will not be replaced"
    return None


def check_output_file(path: str | Path) -> str | None:
    """Say why a file cannot be written at `path`, or return None; creates its folder."""
    ## Run before any long work, so that a bad path costs the user nothing.
    if problem := output_file_problem(path):
        return problem
    real = Path(os.path.realpath(path))
    if problem := check_output_dir(real.parent):
        return problem
    probe = temporary_name(real)  # 22 characters longer than the name: is it too long here?
    try:
        with open(probe, "xb"):
            pass
        probe.unlink()
    except OSError as err:
        return f"cannot be written: {err.strerror or err}"
    return None


def temporary_name(path: Path) -> Path:
    """A new, hidden name beside `path`, for write_atomically to write before renaming."""
    return path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")


def check_output_dir(folder: str | Path) -> str | None:
    """Say why files cannot be written in `folder`, or return None; creates the folder."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        return f"{folder} exists and is not a folder"
    except OSError as err:
        return f"cannot create the folder {folder}: {err.strerror}"
    try:  # permissions, a read-only disk, a quota: only trying to write tells for sure
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".write-test-")
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        return f"cannot write files in {folder}: {err.strerror}"
    return None


def write_atomically(path: str | Path, data: bytes) -> None:
    """Replace the regular file `path` by `data`, all or nothing; raise OutputError on failure."""
    ## Write a temporary file in the target's own folder, flush it to disk, then rename it over
    ## the target. os.replace is atomic: a crash, Ctrl-C or full disk at any moment leaves the
    ## old file or the new one, never half of one. The temporary file is removed, except after
    ## a kill that gives Python no chance (kill -9, power loss): then a .tmp file may remain.
    real = Path(os.path.realpath(path))  # through a symlink: replace the file it points to
    ## The name is chosen before the file exists, so that the `finally` below can remove it
    ## whenever an interruption comes, even in the middle of creating it.
    tmp = temporary_name(real)
    try:
        real.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "xb") as f:  # "x": a new file, never one that exists
            f.write(data)
            f.flush()
            os.fsync(f.fileno())  # the bytes are on disk before the rename makes them visible
        ## Checked again right before the rename, because the path may have changed during a
        ## long run: os.replace over /dev/null would turn the device into a regular file.
        if problem := output_file_problem(real):
            raise OutputError(f"{path} {problem}")
        replace_retrying(tmp, real)
    except PermissionError as err:
        held = (" On Windows this means another program holds the file open (a spreadsheet, "
                "an image viewer, a virus scanner): close it and run again."
                if sys.platform == "win32" else "")
        raise OutputError(f"could not write {path}: {err.strerror or err}.{held} The previous "
                          "version of that file, if there was one, is unchanged.") from err
    except OSError as err:
        raise OutputError(f"could not write {path}: {err.strerror or err}. The previous version "
                          "of that file, if there was one, is unchanged.") from err
    finally:
        with contextlib.suppress(OSError):  # a name too long to create is too long to remove
            tmp.unlink(missing_ok=True)  # gone already after a successful os.replace


def replace_retrying(source: Path, target: Path, tries: int = 5) -> None:
    """os.replace, tried again for a moment while another program holds the target."""
    ## On Windows a file that another program has open cannot be replaced (PermissionError).
    ## Virus scanners and search indexers open new files for a moment only: wait and retry.
    for attempt in range(1, tries + 1):
        try:
            os.replace(source, target)
            return
        except PermissionError:
            if attempt == tries:
                raise
            time.sleep(0.1 * attempt)


# ---------------------------------------------------------------------------------------------
# command lines


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """--help with each option's default, except None and False: "(default: None)" says
    nothing, and contradicts a help text that describes the default itself."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser that, for an unknown flag, names the one meant: --epoch, --epochs.

    Give it allow_abbrev=False, or argparse takes a shortened --epoch for --epochs silently.
    """

    def error(self, message: str):
        if message.startswith("unrecognized arguments: "):
            flags = [o for action in self._actions for o in action.option_strings
                     if o.startswith("--")]
            for word in message.split()[2:]:
                typed = word.split("=")[0]
                if typed == "--":  # "the end of the flags": what follows is not one
                    break
                if not typed.startswith("--"):
                    continue
                meant = ([f for f in flags if f.startswith(typed)]  # --epoch: --epochs
                         or difflib.get_close_matches(typed, flags, n=1, cutoff=0.8))  # --hiden
                if meant:
                    message += f" (did you mean {' or '.join(meant)}?)"
                    break
        super().error(message)


def positive(kind):
    """argparse type: a positive, finite int or float, with a readable error."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            whole = " whole" if kind is int else ""  # 1.5 is positive, but no whole number
            raise argparse.ArgumentTypeError(f"expected a positive{whole} number, got {text!r}"
                                             ) from None
        if not (value > 0 and math.isfinite(value)):
            raise argparse.ArgumentTypeError(f"must be a finite number greater than 0, got {text}")
        ## A learning rate of 1e39 would not even fit in a float32 tensor; a size of 10**20
        ## would overflow PyTorch's 64-bit sizes (2**31 - 1 is far more than any memory holds).
        limit, said = (2**31 - 1, "2147483647") if kind is int else (1e30, "1e30")
        if value > limit:
            raise argparse.ArgumentTypeError(f"must be at most {said}, got {text}")
        return value
    return parse


def number_from(low: int, high: int):
    """argparse type: a whole number from `low` to `high`."""
    def parse(text: str) -> int:
        if not text.isdigit() or not low <= int(text) <= high:
            raise argparse.ArgumentTypeError(f"expected a whole number from {low} to {high}, "
                                             f"got {text!r}")
        return int(text)
    return parse


def seed_number(text: str) -> int:
    """argparse type: a seed from 0 to 2**32 - 1 (torch takes up to 2**64 - 1, but each epoch
    and each torchrun process adds its number to the seed)."""
    return number_from(0, 2**32 - 1)(text)


def worker_count(text: str) -> int:
    """argparse type for --num-workers: 0 to 64. Each DataLoader worker is a process with its
    own Python and torch (a few hundred MB): thousands would fill the memory."""
    return number_from(0, 64)(text)


def say(line: str, stream) -> None:
    """Print a line; a character the terminal cannot show becomes an escape, not a crash."""
    ## A control character in a file name (a newline, a terminal's escape code) is shown as \n
    ## or \x1b, as `ls` does: else one name could print as two lines, or recolour the screen.
    line = "".join(c if c >= " " and c != "\x7f" or c == "\t" else repr(c)[1:-1] for c in line)
    if stream is sys.stderr and sys.stdout is not None:  # `> log.txt 2>&1`: the lines in the
        sys.stdout.flush()  # order they were said, not stdout's buffered ones after the errors
    ## On Windows, output to a file or pipe is encoded in the system's ANSI code page (cp1252,
    ## say), where a file name in another script would raise UnicodeEncodeError and end the
    ## whole batch.
    try:
        print(line, file=stream)
    except UnicodeEncodeError:
        encoding = stream.encoding or "ascii"
        print(line.encode(encoding, "backslashreplace").decode(encoding), file=stream)


def is_closed_output(err: OSError) -> bool:
    """Whether `err` means that the program reading stdout closed it (`| head -1`)."""
    ## POSIX says so with BrokenPipeError. On Windows the same failure can show up as EINVAL
    ## (CPython issue #79935). Other Windows errors can map to EINVAL too, but they carry a
    ## Windows error code (winerror) or a file name; this one has neither.
    return isinstance(err, BrokenPipeError) or (
        sys.platform == "win32" and err.errno == errno.EINVAL
        and getattr(err, "winerror", None) is None and err.filename is None)


def output_failure(err: OSError) -> str | None:
    """Why writing to stdout failed, when `err` says it did; None for any other OSError."""
    if is_closed_output(err):
        return "the program reading the output closed it"
    ## `> log.txt` on a full disk. The repo's own files are written by write_atomically, whose
    ## errors are OutputErrors that name the file; a bare ENOSPC with no file name is stdout's.
    if err.filename is None and err.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", None)):
        return f"the output could not be written ({err.strerror})"
    return None


def output_closed(note: str | None = None) -> None:
    """Stdout cannot take more (`predict.py *.png | head -1`, or a full disk): say `note` on
    stderr, and point stdout at the null device. The caller then exits with code 1."""
    ## Python raises BrokenPipeError at the next print (or OSError EINVAL on Windows: see
    ## is_closed_output). Python's own recipe (the signal module's "Note on SIGPIPE"): point
    ## stdout at the null device, so that the flush at exit does not fail a second time.
    if note:
        with contextlib.suppress(OSError):  # the note may have nowhere to go either
            print(note, file=sys.stderr)
    with contextlib.suppress(OSError, ValueError, AttributeError):  # no real stdout: nothing
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def output_stopped(err: OSError) -> bool:
    """If `err` is stdout failing, end the output as output_closed() does and return True: a
    closed pipe quietly (`| head`, as Unix tools do), a full disk with an error line."""
    if (why := output_failure(err)) is None:
        return False
    output_closed(None if is_closed_output(err) else f"error: {why}.")
    return True


def flush_output(code: int) -> int:
    """A script's last step: write what stdout still buffers; `code`, or 1 if it was closed."""
    if sys.stdout is None:  # started with no stdout at all (`>&-`): print() wrote nothing
        return code
    try:
        sys.stdout.flush()  # here a closed pipe can still be caught; at exit it is a traceback
    except OSError as err:  # the work was done, but its output was cut short
        if not output_stopped(err):
            raise
        return 1
    return code


# ---------------------------------------------------------------------------------------------
# distributed training
## `torchrun --nproc_per_node=N script.py` starts N copies of the script. Each copy is a "rank"
## (0..N-1) and finds its number in environment variables that torchrun sets. Every rank holds a
## full copy of the model and takes its own batches, a different share of the data;
## DistributedDataParallel (DDP) averages the gradients across ranks during backward(), so all
## copies take the same step and stay identical. Without torchrun none of this runs: world_size
## is 1 and nothing is initialised.


def init_distributed(device: torch.device) -> tuple[int, int, torch.device]:
    """Join torchrun's process group if there is one; return (rank, world_size, device)."""
    if "WORLD_SIZE" not in os.environ:  # plain `python script.py`
        return 0, 1, device
    import torch.distributed as dist

    if device.type == "mps":  # gloo, the only backend on a Mac, cannot send MPS tensors
        raise ValueError("torchrun cannot use Apple's GPU (mps): PyTorch's only backend there, "
                         "gloo, handles CPU tensors only. Add --device cpu to train in several "
                         "processes on the CPU, or run without torchrun to use the GPU")
    if device.type == "cuda":  # one GPU per process: rank k on this node uses GPU k
        local_rank, count = int(os.environ.get("LOCAL_RANK", 0)), torch.cuda.device_count()
        if local_rank >= count:
            raise ValueError(f"this process is local rank {local_rank}, but this machine has "
                             f"{count} GPU(s): give torchrun --nproc_per_node={count} (at most "
                             "one process per GPU), or --device cpu")
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    ## NCCL moves tensors GPU-to-GPU; gloo works on CPU tensors, for CPU training and tests.
    ## Windows has no NCCL, and its PyTorch is built without libuv, which gloo's rendezvous
    ## otherwise asks for (pytorch/pytorch#139990): USE_LIBUV=0 turns that off.
    if sys.platform == "win32":
        os.environ.setdefault("USE_LIBUV", "0")
    backend = "nccl" if device.type == "cuda" and sys.platform != "win32" else "gloo"
    ## Imported here, before the group exists, on purpose. torch.distributed.nn's functions
    ## take `group=WORLD` as a default argument, and Python evaluates a default once, when the
    ## module is imported: None before init_process_group, the group itself after. Creating
    ## the optimizer imports that module (through torch._dynamo); imported after init, those
    ## defaults would keep the group alive for good, and its gloo threads, which stop only when
    ## the group is freed, would still run as Python shuts down: that aborted a finished run at
    ## exit about once in 80 on this project's test machine. (`as _`: a plain `import
    ## torch.distributed.nn` would make `torch` a local name here, breaking `torch.cuda` above.)
    import torch.distributed.nn as _  # noqa: F401

    dist.init_process_group(backend)
    return dist.get_rank(), dist.get_world_size(), device


def is_main_process() -> bool:
    """True in a plain run and on rank 0: the one process that prints and saves."""
    if "WORLD_SIZE" not in os.environ:  # plain run: do not even import torch.distributed
        return True
    import torch.distributed as dist

    if dist.is_initialized():
        return dist.get_rank() == 0
    return os.environ.get("RANK", "0") == "0"  # under torchrun, before init_distributed()


def all_reduce_sum(values: list[float], device: torch.device) -> list[float]:
    """Sum each number over all ranks (unchanged in a plain run)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return values
    ## float64 keeps sums of many numbers exact enough; MPS has no float64 (torchrun refuses
    ## MPS anyway, but a copied function should not fail there).
    dtype = torch.float32 if device.type == "mps" else torch.float64
    tensor = torch.tensor(values, dtype=dtype, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor.tolist()


def wait_for_all_ranks() -> None:
    """Under torchrun, wait until every rank has got here; in a plain run, return at once."""
    ## A rank that leaves the process group while another still works in it can bring the
    ## whole run down as it shuts its connections.
    if "WORLD_SIZE" not in os.environ:
        return
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()


def cleanup_distributed() -> None:
    """Leave the process group, if this process joined one."""
    if "WORLD_SIZE" not in os.environ:  # plain run: nothing was initialised
        return
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
