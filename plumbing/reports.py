"""What mnist_train.py prints around the lesson: a sanity report before training; after the final
test, the confusion matrix, a picture of the mistakes and a warning for a run that did not learn.
These are the usual first steps of troubleshooting, done for you: each says what to look at.
"""

import contextlib
import csv
import io
import math
from pathlib import Path

import torch
from PIL import Image, ImageDraw, ImageFont
from torch import nn

from plumbing import files

DIGITS = [str(digit) for digit in range(10)]


def sanity_report(model: nn.Module, loader, criterion: nn.Module, device: torch.device,
                  splits: tuple) -> None:
    """Versions, device, shapes, ranges and the untrained model's loss: what to check first."""
    inputs, targets = next(iter(loader))
    params = sum(p.numel() for p in model.parameters())
    print(f"PyTorch {torch.__version__} | device {device} | {type(model).__name__.lower()} with "
          f"{params:,} parameters | {len(splits[0]):,} train / {len(splits[1]):,} val / "
          f"{len(splits[2]):,} test images")
    print(f"a validation batch: inputs {list(inputs.shape)} {str(inputs.dtype)[6:]} in "
          f"[{inputs.min():.2f}, {inputs.max():.2f}], labels {list(targets.shape)} "
          f"{str(targets.dtype)[6:]} in {targets.min()}..{targets.max()}")
    with torch.no_grad():
        loss = criterion(model(inputs.to(device)), targets.to(device)).item()
    ## An untrained classifier spreads its bets evenly: p = 1/10 per class, loss = -ln(1/10).
    print(f"initial loss {loss:.4f} (an untrained 10-class model should be near ln(10) = "
          f"{math.log(10):.4f})")
    if not abs(loss - math.log(10)) < 1.0:
        print("warning: the initial loss is far from ln(10): check the labels (0..9), the "
              "input normalisation and the model's last layer (no softmax before the loss)")


def open_tensorboard(log_dir: str | None):
    """A TensorBoard SummaryWriter for log_dir, or, without one, a context that yields None."""
    if log_dir is None:
        return contextlib.nullcontext()
    from torch.utils.tensorboard import SummaryWriter  # here: only runs that log need it
    return SummaryWriter(log_dir)


def scheduled_rate(scheduler) -> str:
    """' | lr 1.00e-03' for the epoch line of a run with a learning-rate schedule, else ''."""
    return f" | lr {scheduler.optimizer.param_groups[0]['lr']:.2e}" if scheduler else ""


def write_history(path: Path, history: list[list], writer) -> None:
    """Rewrite the per-epoch CSV, whole, and log the last epoch to TensorBoard."""
    text = io.StringIO()
    header = ["epoch", "train_loss", "val_loss", "val_accuracy", "seconds", "saved"]
    rows = [[epoch, *(f"{float(x):.6f}" for x in losses), f"{float(s):.3f}", int(saved)]
            for epoch, *losses, s, saved in history]
    csv.writer(text).writerows([header, *rows])
    with files.written_whole(path) as f:
        f.write(text.getvalue().encode())
    if writer is not None:
        epoch, train_loss, val_loss, val_acc = history[-1][:4]
        writer.add_scalars("loss", {"train": float(train_loss), "val": float(val_loss)}, epoch)
        writer.add_scalar("accuracy/val", float(val_acc), epoch)


def after_test(args, mistakes: Path, classes: list[str], images: torch.Tensor,
               guesses: torch.Tensor, truth: torch.Tensor, history: list, n_train: int) -> None:
    """Print the confusion matrix, draw the first mistakes into `mistakes`, and warn if the
    run (its `history`: a row per epoch, as in the CSV) did not learn."""
    print(format_confusion_matrix(confusion_matrix(guesses, truth, len(classes)), classes))
    wrong = (guesses != truth).nonzero().flatten()
    if args.dry_run:
        print("mistakes picture: not written in a dry run")
    elif len(wrong) == 0:
        print("no mistakes on the test set, so no mistakes picture")
    else:
        first = wrong[:64]  # in test-set order: the same picture every run
        write_grid(mistakes, [labelled_tile(images[i], classes[truth[i]], classes[guesses[i]])
                              for i in first])
        print(f"the first {len(first)} of {len(wrong)} mistakes, as pictures: {mistakes}")
    ## Near chance (below twice chance) on validation *and* test: a validation set of a few
    ## pictures can be at 0 by bad luck alone. Runs on fewer than 1,000 pictures get no verdict.
    near_chance, test_acc = 2 / len(classes), (guesses == truth).float().mean().item()
    best_acc, train_losses = max(row[3] for row in history), [row[1] for row in history]
    if not args.dry_run and n_train >= 1000 and best_acc < near_chance and test_acc < near_chance:
        print(did_not_learn(best_acc, len(classes), args.lr, args.optimizer,
                            train_losses, args.clip_grad))


def predict_all(model: nn.Module, loader, device: torch.device,
                amp_dtype: torch.dtype | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's guess for every picture of `loader`, in order, and the true labels."""
    model.eval()
    guesses, truth = [], []
    with torch.inference_mode(), torch.autocast(device.type, amp_dtype, amp_dtype is not None):
        for inputs, targets in loader:
            guesses.append(model(inputs.to(device)).argmax(dim=1).cpu())
            truth.append(targets.cpu())
    return torch.cat(guesses), torch.cat(truth)


def confusion_matrix(guesses: torch.Tensor, truth: torch.Tensor, classes: int = 10) -> torch.Tensor:
    """counts[t, g]: how many pictures of class t the model called g (rows: the true class)."""
    return torch.bincount(truth * classes + guesses, minlength=classes**2).view(classes, classes)


def format_confusion_matrix(counts: torch.Tensor, names: list[str]) -> str:
    """The matrix as a table, with each class's accuracy and the most frequent confusions."""
    classes = len(counts)
    kind = "digit" if names == DIGITS else "class"
    lines = [f"confusion matrix of the best model on the test set (rows: true {kind}, columns: "
             f"predicted {kind})"]
    if kind == "class":  # the table has room for numbers only: say which class each one is
        lines.append("classes: " + ", ".join(f"{c} {name}" for c, name in enumerate(names)))
    lines.append("true |" + "".join(f"{g:>6}" for g in range(classes)) + " | correct")
    for t in range(classes):
        accuracy = counts[t, t] / counts[t].sum().clamp(min=1)
        lines.append(f"{t:>4} |" + "".join(f"{int(c):>6}" for c in counts[t])
                     + f" | {accuracy:7.1%}")
    top = (counts * (1 - torch.eye(classes, dtype=counts.dtype))).flatten().topk(3)
    pairs = [f"{names[int(i) // classes]} as {names[int(i) % classes]} ({int(n)}x)"
             for n, i in zip(top.values, top.indices) if n > 0]
    lines.append("most frequent mistakes: " + (", ".join(pairs) or "none"))
    return "\n".join(lines)


def labelled_tile(image: torch.Tensor, true: str, guess: str, scale: int = 4) -> Image.Image:
    """A uint8 28 x 28 picture, enlarged, above a caption such as "true 4, guess 9"."""
    size = 28 * scale
    tile = Image.new("L", (size, size + 24))  # black, like the digits' background
    digit = Image.frombytes("L", (28, 28), bytes(image.flatten().tolist()))
    tile.paste(digit.resize((size, size), Image.NEAREST))  # big, crisp pixels
    draw, caption = ImageDraw.Draw(tile), f"true {true}, guess {guess}"
    font = ImageFont.load_default(size=16)
    if draw.textlength(caption, font=font) > size - 4:  # long class names: two smaller lines
        caption, font = f"true {true}\nguess {guess}", ImageFont.load_default(size=11)
    draw.multiline_text((size / 2, size + 12), caption, fill=255, anchor="mm", align="center",
                        font=font, spacing=1)
    return tile


def write_grid(path: Path, tiles: list[Image.Image], columns: int = 8, gap: int = 3) -> None:
    """Write tiles of one size into a PNG, whole, in rows of `columns`, `gap` px of gray apart."""
    w, h = tiles[0].size
    grid = Image.new("L", (min(columns, len(tiles)) * (w + gap) + gap,
                           math.ceil(len(tiles) / columns) * (h + gap) + gap), 128)
    for i, tile in enumerate(tiles):
        grid.paste(tile, (gap + (i % columns) * (w + gap), gap + (i // columns) * (h + gap)))
    with files.written_whole(path) as f:
        grid.save(f, format="png")


def did_not_learn(best_acc: float, classes: int, lr: float, optimizer: str,
                  train_losses: list[float], clip_grad: float | None = None) -> str:
    """The warning for a run that stayed near chance, with what to check, in order."""
    ## Too high a rate overshoots: the loss climbs far above an untrained model's, ln(classes).
    start, worst = math.log(classes), max(train_losses)
    low, high, usual = {"adam": (1e-4, 1e-2, "Adam's usual 1e-4 to 1e-2"),
                        "sgd": (1e-3, 1e-1, "SGD's usual 1e-3 to 1e-1")}[optimizer]
    ## Clipping shrinks SGD's steps with the gradients; Adam divides each gradient by its own
    ## running size, so its steps shrink only where the clipped gradients near its eps (1e-8).
    if clip_grad is not None and clip_grad < (1e-3 if optimizer == "sgd" else 1e-6):
        rate = f"--clip-grad {clip_grad:g} is so small that every step is nearly 0: try 1.0"
    elif worst > 2 * start:
        rate = (f"the training loss reached {worst:.4g}, where an untrained model has ln({classes})"
                f" = {start:.2f}: --lr {lr:g} is too high, try --lr {min(lr / 10, high):g}")
    elif not low <= lr <= high:  # 10x closer to the usual range, and never outside it
        way, better = ("higher", min(lr / 10, high)) if lr > high else ("lower", max(lr * 10, low))
        rate = f"--lr {lr:g} is {way} than {usual}: try --lr {better:g}"
    else:
        rate = (f"--lr {lr:g}: if the loss jumped, try --lr {lr / 10:g}; if it barely fell, "
                f"--lr {lr * 10:g}")
    return (f"warning: the best validation accuracy, {best_acc:.4f}, is near chance "
            f"({1 / classes:.2f} for {classes} classes): the model did not learn. Check, in this "
            f"order: the learning rate ({rate}); the labels (the sanity report shows their "
            "range); the input normalisation (its input range); and whether the loop can learn "
            "at all: with --subset 100 --epochs 50 the training loss should fall near 0.")
