"""What the scripts share: seeding, the device, the models, and one epoch of training and of
evaluation. docs/using-common.md shows them in a project of your own. Copy the whole file (it
imports nothing else of this repo), or paste set_seed, get_device, MLP, CNN, train_one_epoch or
evaluate alone into a file that starts with these imports:

    import math, random
    from collections import OrderedDict
    from collections.abc import Callable, Iterable, Sequence
    import torch
    from torch import nn
"""

import math
import random
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence

import torch
from torch import nn

MNIST_MEAN, MNIST_STD = 0.1307, 0.3081  # mean and std of MNIST training pixels scaled to 0..1


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
## A model is an nn.Module: its layers hold the weights, which model.parameters() finds and
## model.to(device) moves; forward() runs them. Each layer starts uniformly within
## +-1/sqrt(its inputs), which suits small networks (synthetic_train.py picks Xavier's instead).
class MLP(nn.Sequential):
    """mnist_minimal.py's MLP, 784 -> 128 -> 64 -> 10, with any hidden sizes; returns logits."""

    def __init__(self, hidden: Sequence[int] = (128, 64), num_classes: int = 10) -> None:
        ## nn.Sequential's forward() runs its layers in order: flatten, fc1, relu1, fc2, relu2,
        ## fc3, by default. The layers are named as mnist_minimal.py names them, so the saved
        ## weights are fc1.weight, fc1.bias, ... in both.
        sizes = [28 * 28, *hidden, num_classes]
        layers = [("flatten", nn.Flatten())]  # [batch, 1, 28, 28] -> [batch, 784]
        for i in range(1, len(sizes)):
            layers += [(f"fc{i}", nn.Linear(sizes[i - 1], sizes[i])), (f"relu{i}", nn.ReLU())]
        super().__init__(OrderedDict(layers[:-1]))  # no ReLU after the last layer: the logits


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


# one epoch of training, and of evaluation ----------------------------------------------------
def train_one_epoch(model: nn.Module, loader: Iterable, criterion: nn.Module,
                    optimizer: torch.optim.Optimizer, device: torch.device | str, *,
                    epoch: int = 1, log_interval: int = 200, amp_dtype: torch.dtype | None = None,
                    scaler: torch.amp.GradScaler | None = None, clip_grad: float | None = None,
                    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
                    log: Callable[[str], None] | None = print) -> float:
    """mnist_minimal.py's train(): one pass over `loader` in five steps per batch; returns the
    mean loss per sample. The options are what mnist_train.py adds: AMP, clipping, a schedule."""
    device = torch.device(device)
    model.train()  # Dropout and BatchNorm behave as in training; evaluate() switches them back
    scaler = scaler or torch.amp.GradScaler(device.type, enabled=False)  # None: a no-op one
    ## The loss summed over samples, and their count, so far; `logged`: both at the last log.
    total, seen, logged = torch.zeros((), device=device), 0, (0.0, 0)
    batches = len(loader) if hasattr(loader, "__len__") else "?"  # a generator has no length
    for batch, (inputs, targets) in enumerate(loader, start=1):
        inputs, targets = inputs.to(device), targets.to(device)  # no copy if already there
        optimizer.zero_grad(set_to_none=True)  # 1. backward() *adds* to .grad: clear it first
        ## 2. forward, 3. the loss; with amp_dtype, autocast runs the matmuls in 16 bits (AMP).
        with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            loss = criterion(model(inputs), targets)
        ## 4. backward: each weight's .grad gets d(loss)/d(weight). (float16's range is narrow:
        ## an enabled scaler multiplies the loss first, so that small gradients do not become 0.)
        scaler.scale(loss).backward()  # disabled (no --amp fp16): just loss.backward()
        if clip_grad is not None:  # cap their joint norm: one bad batch cannot undo training
            scaler.unscale_(optimizer)  # the true gradients, not the scaled ones
            nn.utils.clip_grad_norm_(model.parameters(), clip_grad)
        ## 5. step: move each weight against its gradient. step() before backward(), or
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
    if not math.isfinite(average := total.item() / seen):
        raise FloatingPointError(f"the training loss became {average} in epoch {epoch}: try a 10x"
                                 " lower learning rate or clipping; check inputs for NaN or inf.")
    return average


def evaluate(model: nn.Module, loader: Iterable, criterion: nn.Module, device: torch.device | str,
             *, amp_dtype: torch.dtype | None = None) -> tuple[float, float]:
    """mnist_minimal.py's test(), with the loss: (average loss per sample, accuracy) of `model`
    on `loader`, without training it."""
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
