"""Train a small network on MNIST handwritten digits and keep the best model.

    python mnist_train.py --epochs 5               # the MLP: about 97.3-97.5% test accuracy
    python mnist_train.py --model cnn --epochs 5   # a small CNN: about 99%, slower on a CPU
    python mnist_train.py --dry-run                # one batch of each phase, to check the script
    python predict.py samples/photo_3.jpg          # then classify a picture (or your own)

What you should see (the MLP, in seconds; the README says how to read each line):

    PyTorch 2.14.1+cu130 | device cpu | mlp with 109,386 parameters | 55,000 train / ...
    epoch 1/5 | train loss 0.2850 | val loss 0.1802 | val acc 0.9422 | 0.6 s | saved best
    ...
    Test Accuracy: 0.9730 (9730/10000)      # 0.9730 to 0.9748, by CPU and thread count

train() is the lesson: 1. data -> 2. model -> 3. loss -> 4. optimizer -> 5. training loop ->
6. final test; each step's details follow it. What keeps the script working in real use (bad
paths, Ctrl-C, --resume, joining torchrun's processes) is in safeguards.py.
"""

import argparse
import copy
import os
import sys
import time
from functools import partial
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset

import augmentation
import common
import reports
import safeguards
from safeguards import UsageError


def train(args: argparse.Namespace, run: safeguards.RunFiles) -> None:
    """The lesson. On a first read, skip rank and world (torchrun) and `run` (files, --resume)."""
    rank, world, device = setup(args)  # seed, device; torchrun's rank, world (0, 1 without)

    # 1. data ----------------------------------------------------------------------------------
    ## 60,000 training pictures (uint8 [N, 28, 28], labels 0..9), --val-size of them held out
    ## to pick the best epoch; 10,000 test pictures, used once at the end for an honest estimate.
    folder, classes = DATASETS[args.dataset]
    images, labels = common.load_mnist(args.data_dir, train=True, dataset=folder)
    test_images, test_labels = common.load_mnist(args.data_dir, train=False, dataset=folder)
    ## Inputs are standardised to a mean of 0 and a spread of 1, which the default weights and
    ## learning rate suit. predict.py must do the same: the saved model file keeps the two.
    mean, std = normalisation(args.dataset, images)
    train_idx, val_idx, test_idx = choose_splits(args, len(labels), len(test_labels), world)
    loader = partial(make_loader, args, mean=mean, std=std, device=device, rank=rank, world=world)
    train_loader = loader(images[train_idx], labels[train_idx], shuffle=True)
    val_loader = loader(images[val_idx], labels[val_idx])
    test_loader = loader(test_images[test_idx], test_labels[test_idx], rank=0, world=1)

    # 2. model ---------------------------------------------------------------------------------
    sizes = model_sizes(args)  # --hidden and --channels, if given
    model = common.build_model(args.model, **sizes).to(device)  # random weights, by --seed

    # 3. loss ----------------------------------------------------------------------------------
    ## The model ends in 10 raw scores ("logits"): CrossEntropyLoss takes their log-softmax
    ## itself, so no softmax before it. (To predict a number, not a class: nn.MSELoss.)
    criterion = nn.CrossEntropyLoss()

    # 4. optimizer -----------------------------------------------------------------------------
    optimizer = make_optimizer(args.optimizer, model.parameters(), args.lr, device)
    steps = args.epochs * len(train_loader)  # optimizer steps in the whole run
    scheduler = make_schedule(args.schedule, optimizer, steps)  # None: a constant rate
    ## What real runs add (skip it at first); by default train_model and eval_model are model.
    amp_dtype = safeguards.amp_dtype(args.amp, device)  # --amp: 16-bit maths; None: float32
    scaler = torch.amp.GradScaler(device.type) if amp_dtype == torch.float16 else None
    if rank == 0:  # what to look at first when training misbehaves
        reports.sanity_report(args.model, model, val_loader, criterion, device,
                              (train_idx, val_idx, test_idx), untrained=not run.resumed)
    ## torchrun: under DDP, loss.backward() averages all ranks' gradients (docs/distributed.md)
    train_model = nn.parallel.DistributedDataParallel(model) if world > 1 else model
    averaged = weight_average(model, optimizer, steps) if args.ema else None
    eval_model = model if averaged is None else averaged  # --ema: the average is judged, saved
    if args.compile:  # in place: training, and evaluation without --ema, run the compiled code
        model.compile()

    # 5. training loop -------------------------------------------------------------------------
    best_acc, best_epoch, best_weights, history = run.begin(  # fresh: -1.0, 0, None, []
        safeguards.as_words(args, RUN_SETTINGS), model=model, optimizer=optimizer,
        scaler=scaler, scheduler=scheduler, ema=averaged)  # the state that --resume needs
    with reports.open_tensorboard(args.tensorboard if rank == 0 else None) as writer:
        for epoch in range(len(history) + 1, args.epochs + 1):  # --resume: from the next one
            start = time.perf_counter()
            train_loader.set_epoch(epoch)  # shuffled with --seed + epoch, also after --resume
            train_loss = common.train_one_epoch(
                train_model, train_loader, criterion, optimizer, device, epoch=epoch,
                log_interval=args.log_interval, amp_dtype=amp_dtype, scaler=scaler,
                clip_grad=args.clip_grad, scheduler=scheduler, log=print if rank == 0 else None)
            val_loss, val_acc = common.evaluate(eval_model, val_loader, criterion, device,
                                                amp_dtype=amp_dtype)
            train_loss, val_loss, val_acc = safeguards.reduce_metrics(  # as is without torchrun
                train_loss, val_loss, val_acc, len(val_idx[rank::world]), world, device)
            ## Keep the weights that do best on validation data, not the last (later epochs can
            ## overfit), as a copy: state_dict() shares memory with weights that keep changing.
            if saved := val_acc > best_acc:  # := also keeps the answer, for the epoch line
                best_acc, best_epoch = val_acc, epoch
                best_weights = {k: v.clone() for k, v in eval_model.state_dict().items()}
            if rank == 0:
                seconds = time.perf_counter() - start
                history.append([epoch, train_loss, val_loss, val_acc, seconds, int(saved)])
                with run.saving(epoch, (best_epoch, best_acc)):  # every epoch; Ctrl-C waits
                    common.save_checkpoint(
                        run.checkpoint, best_weights, model_name=args.model, mean=mean, std=std,
                        epoch=best_epoch, val_accuracy=best_acc, sizes=sizes, classes=classes,
                        dataset=args.dataset, training=run.training_state(epoch, history))
                    reports.write_history(run.csv, history, writer)
                print(f"epoch {epoch}/{args.epochs} | train loss {train_loss:.4f} | val loss "
                      f"{val_loss:.4f} | val acc {val_acc:.4f}{reports.rate(scheduler)} | "
                      f"{seconds:.1f} s" + (" | saved best" if saved else ""))

    # 6. final test ----------------------------------------------------------------------------
    ## The best model, reloaded from disk (proof that it loads), on pictures it has never seen.
    if rank == 0:
        best_model, _ = common.load_model(run.checkpoint, device)
        guesses, truth = predict_all(best_model, test_loader, device, amp_dtype)
        correct = int((guesses == truth).sum())
        print(f"best epoch {best_epoch} (val acc {best_acc:.4f}) saved to {run.checkpoint}; "
              f"metrics in {run.csv}")
        print(f"Test Accuracy: {correct / len(truth):.4f} ({correct}/{len(truth)})")
        reports.after_test(args, run.mistakes, classes, test_images[test_idx], guesses, truth,
                           best_acc, len(train_idx), [float(row[1]) for row in history])


# ---------------------------------------------------------------------------------------------
# The details of each step, in the order train() takes them.

## --dataset: torchvision's folder (DATA_DIR/<folder>/raw/) and class names; nothing else changes.
DATASETS = {
    "mnist": ("MNIST", reports.DIGITS),
    "fashion-mnist": ("FashionMNIST", ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                       "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]),
}


def setup(args: argparse.Namespace) -> tuple[int, int, torch.device]:
    """Join torchrun's processes (if any), fetch the data once, seed, set how the maths run."""
    device = common.get_device(args.device)  # "auto": the accelerator if there is one
    if args.device == "auto" and (note := safeguards.missing_gpu_note(device)):
        print(note)  # an NVIDIA driver, but no GPU that this PyTorch can use
    rank, world, device = safeguards.init_distributed(device)  # (0, 1, device) without torchrun
    safeguards.download_mnist(args.data_dir, DATASETS[args.dataset][0])  # if not there yet
    ## Seeds weight initialisation, dropout and --augment; the loaders shuffle with their own
    ## generators, from --seed too. + rank: each rank draws its own dropout and augmentation.
    common.set_seed(args.seed + rank)
    safeguards.set_maths(device, args.deterministic)  # faster maths; or repeatable on GPUs
    return rank, world, device


def normalisation(dataset: str, images: torch.Tensor) -> tuple[float, float]:
    """The mean and std of the training pictures' pixels (0..1), to standardise inputs with."""
    if dataset == "mnist":  # the values everyone uses: the same as computing them, rounded
        return common.MNIST_MEAN, common.MNIST_STD
    pixels = images.float().div_(255)
    return round(pixels.mean().item(), 4), round(pixels.std().item(), 4)


def choose_splits(args: argparse.Namespace, n_train: int, n_test: int,
                  world: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Indices of the training, validation and test pictures, after --subset and --dry-run."""
    if args.val_size >= n_train:
        raise UsageError(f"--val-size {args.val_size} leaves nothing to train on: the training "
                         f"set has {n_train} images")
    ## The split depends on --seed alone: every run and rank with it validates on the same ones.
    order = torch.randperm(n_train, generator=torch.Generator().manual_seed(args.seed))
    train_idx, val_idx = order[args.val_size :], order[: args.val_size]
    test_idx = torch.arange(n_test)
    if args.subset is not None and args.subset > len(train_idx):
        raise UsageError(f"--subset {args.subset} is larger than the {len(train_idx)} training "
                         "images left after the validation split")
    train_idx = train_idx[: args.subset]  # [:None] is all of them
    if args.dry_run:  # one batch of each, on every rank
        train_idx = train_idx[: args.batch_size * world]
        val_idx, test_idx = val_idx[: args.test_batch_size], test_idx[: args.test_batch_size]
    return train_idx, val_idx, test_idx


def make_loader(args: argparse.Namespace, images: torch.Tensor, labels: torch.Tensor, *,
                mean: float, std: float, device: torch.device, shuffle: bool = False,
                rank: int = 0, world: int = 1):
    """Batches of (standardised pictures, labels); for training, shuffled anew every epoch."""
    batch_size = args.batch_size if shuffle else args.test_batch_size
    augment = shuffle and args.augment  # training batches only: judge the pictures as they are
    if args.loader == "dataloader":
        return classic_loader(args, PictureDataset(images, labels, mean, std), batch_size,
                              device, shuffle, augment, rank, world)
    ## Decoded and standardised once, on the training device: a batch is one indexing step.
    return common.TensorLoader(
        common.normalize_images(images, mean, std, device), labels.to(device), batch_size,
        shuffle=shuffle, seed=args.seed, rank=rank, world_size=world,
        transform=partial(augmentation.augment, styles=args.dataset == "mnist") if augment
        else None)  # the writing styles of --augment are for digits only


class PictureDataset(Dataset):
    """The classic Dataset: each picture becomes a standardised tensor when it is asked for."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, mean: float, std: float):
        self.images, self.labels, self.mean, self.std = images, labels, mean, std

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:  # what ToTensor + Normalize do
        return (self.images[i][None].float() / 255 - self.mean) / self.std, int(self.labels[i])


def classic_loader(args, dataset, batch_size, device, shuffle, augment, rank, world):
    """--loader dataloader, the tool for data too big for memory: pictures read one at a time,
    in --num-workers background processes, and collated into batches."""
    ## pin_memory: batches in page-locked memory, which a GPU copies from faster.
    options = dict(num_workers=args.num_workers, persistent_workers=args.num_workers > 0,
                   pin_memory=device.type == "cuda")
    if not shuffle:  # this rank's every world-th picture: each one counted once in all
        return DataLoader(Subset(dataset, range(rank, len(dataset), world)), batch_size, **options)
    ## DistributedSampler: this rank's share of each epoch's shuffled order (without torchrun: all).
    sampler = DistributedSampler(dataset, world, rank, seed=args.seed)
    collate = partial(augmentation.collate_and_augment, styles=args.dataset == "mnist")
    loader = DataLoader(dataset, batch_size, sampler=sampler,
                        collate_fn=collate if augment else None, **options)
    loader.set_epoch = sampler.set_epoch  # as on a TensorLoader: train() calls it every epoch
    return loader


def model_sizes(args: argparse.Namespace) -> dict:
    """--hidden and --channels as build_model() takes them ({}: the model's own defaults)."""
    if args.model == "mlp" and args.channels is not None:
        raise UsageError("--channels is for --model cnn; the MLP has --hidden only")
    if args.model == "cnn" and args.hidden is not None and len(args.hidden) != 1:
        raise UsageError("--model cnn has one hidden linear layer: give --hidden one size")
    hidden = args.hidden if args.model == "mlp" or args.hidden is None else args.hidden[0]
    return {name: value for name, value in (("hidden", hidden), ("channels", args.channels))
            if value is not None}


def make_optimizer(name: str, params, lr: float, device: torch.device) -> torch.optim.Optimizer:
    """Adam or SGD (momentum 0.9), fused on devices that support it."""
    ## Fused: one kernel for all the weights, not several per tensor: same maths, less overhead.
    fused = device.type in ("cpu", "cuda", "mps", "xpu")
    if name == "adam":  # adapts a step size per weight: the forgiving default
        return torch.optim.Adam(params, lr=lr, fused=fused)
    return torch.optim.SGD(params, lr=lr, momentum=0.9, fused=fused)


def make_schedule(name: str, optimizer: torch.optim.Optimizer, total_steps: int):
    """None for a constant learning rate, or a schedule to step once per batch."""
    if name == "constant":
        return None
    ## Warmup + cosine: over the first tenth of the steps the rate climbs to --lr (early steps,
    ## from random weights and with Adam's averages still poor, can throw the model somewhere
    ## bad), then falls along a cosine to 0, so the model settles (by hand: synthetic_train.py).
    warmup = max(1, total_steps // 10)
    schedulers = torch.optim.lr_scheduler
    return schedulers.SequentialLR(optimizer, [
        schedulers.LinearLR(optimizer, start_factor=1 / warmup, total_iters=warmup),
        schedulers.CosineAnnealingLR(optimizer, T_max=max(1, total_steps - warmup))],
        milestones=[warmup])


def weight_average(model: nn.Module, optimizer: torch.optim.Optimizer,
                   total_steps: int) -> nn.Module:
    """--ema: a copy of `model` whose weights follow an average of its recent weights."""
    ## Late in training each step moves the weights a little around a good point, partly at
    ## random; an average of the recent weights sits nearer to it. This one spans about the last
    ## tenth of the run. (torch.optim.swa_utils.AveragedModel: the same, more options, more work.)
    averaged = copy.deepcopy(model).requires_grad_(False)  # uncompiled, if --compile follows
    decay = max(0.0, 1 - 10 / total_steps)
    ## Weights and buffers (BatchNorm's statistics), paired; a shared weight is listed once.
    pairs = list(zip([*averaged.parameters(), *averaged.buffers()],
                     [*model.parameters(), *model.buffers()]))

    @torch.no_grad()
    def update(*_) -> None:
        for average, current in pairs:
            if average.is_floating_point():
                average.lerp_(current, 1 - decay)  # average + (1 - decay) * (current - average)
            else:  # a counter, such as BatchNorm's num_batches_tracked
                average.copy_(current)

    optimizer.register_step_post_hook(update)  # the loop stays as it is
    return averaged


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


# ---------------------------------------------------------------------------------------------
# The settings, and how a run ends.

## The settings that make a run what it is, saved with it: --resume goes on with them.
RUN_SETTINGS = ("model", "hidden", "channels", "dataset", "optimizer", "lr", "batch_size",
                "augment", "clip_grad", "amp", "seed", "val_size", "subset", "loader", "epochs",
                "schedule", "ema")


def build_parser() -> safeguards.ArgumentParser:
    parser = safeguards.ArgumentParser(description=__doc__.split("\n")[0])
    positive, add = safeguards.positive, parser.add_argument
    # training
    add("--epochs", type=positive(int), default=5, help="passes over the data")
    add("--batch-size", type=positive(int), default=64, help="pictures per step; raise --lr too")
    add("--test-batch-size", type=positive(int), default=1000, help="pictures per evaluation batch")
    add("--lr", type=positive(float), default=1e-3, help="learning rate; if the loss is NaN: / 10")
    add("--optimizer", choices=["adam", "sgd"], default="adam", help="sgd: try --lr 0.01")
    add("--model", choices=sorted(common.MODELS), default="mlp",
        help="mlp: fully connected, fast; cnn: convolutional, more accurate, slower on a CPU")
    add("--hidden", type=positive(int), nargs="+", metavar="N",
        help="hidden layer sizes: the MLP's (default 128 64), or the CNN's one (default 128)")
    add("--channels", type=positive(int), nargs=2, metavar=("C1", "C2"),
        help="the CNN's convolution widths (default 16 32)")
    add("--augment", action="store_true", help="random tilt, scale, shift, stroke width and "
        "writing styles on each training batch: reads people's own pictures better")
    add("--schedule", choices=["constant", "warmup-cosine"], default="constant",
        help="warmup-cosine: the rate climbs to --lr over a tenth of the steps, then falls to 0")
    add("--ema", action="store_true", help="judge and save a running average of the weights: "
        "usually a little more accurate, and steadier from seed to seed")
    add("--clip-grad", type=positive(float), metavar="MAX_NORM",
        help="clip the gradient norm to this (try 1.0 if the loss spikes)")
    # data
    add("--dataset", choices=sorted(DATASETS), default="mnist", help="fashion-mnist: clothes")
    add("--data-dir", default="./data", help="MNIST is in (or downloaded to) DATA_DIR/MNIST/raw/")
    add("--val-size", type=positive(int), default=5000, help="pictures to pick the best epoch")
    add("--subset", type=positive(int), metavar="N", help="train on N pictures only")
    add("--loader", choices=["memory", "dataloader"], default="memory", help="memory: batches "
        "cut from tensors decoded once; dataloader: the classic Dataset + DataLoader")
    add("--num-workers", type=safeguards.number_from(0, 64), default=0,
        help="DataLoader worker processes (with --loader dataloader)")
    # system
    add("--device", default="auto", help="auto, cpu, cuda, cuda:1, mps, xpu")
    add("--amp", nargs="?", const="auto", choices=["auto", "bf16", "fp16"], help="mixed "
        "precision: --amp alone is bf16, or fp16 on GPUs without native bf16")
    add("--compile", action="store_true", help="torch.compile the model")
    add("--seed", type=safeguards.number_from(0, 2**32 - 1), default=42,
        help="same seed, same run (bit for bit on one CPU and thread count; GPUs: --deterministic)")
    add("--deterministic", action="store_true", help="bit-identical runs on a GPU too (slower)")
    # output
    add("--save-path", type=safeguards.file_path, help="the checkpoint (default: checkpoints/"
        "mnist_<model>.pt), with the metrics (.csv) and mistakes (_mistakes.png) beside it; an "
        "earlier run's files there are renamed, never replaced")
    add("--log-interval", type=positive(int), default=200, help="log the loss every N batches")
    add("--tensorboard", metavar="DIR", help="also log to DIR (pip install tensorboard)")
    add("--resume", action="store_true", help="go on with the run saved at --save-path, from "
        "its last epoch, with its settings (--epochs can grow)")
    add("--dry-run", action="store_true", help="one batch of each phase, then stop (for CI)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.epochs = 1 if args.dry_run else args.epochs
    name = f"{'dry_run_' * args.dry_run}{args.dataset.replace('-', '_')}_{args.model}.pt"
    run = safeguards.RunFiles(args.save_path or Path("checkpoints", name), args.dry_run)
    rank = f" (rank {os.environ['RANK']})" if "RANK" in os.environ else ""  # under torchrun
    code = 1
    try:
        check_settings(args, run)
        if args.resume:
            resume(args, parser, argv, run)
        with safeguards.stop_signals():  # `kill` and Ctrl-Break stop the run as Ctrl-C does
            train(args, run)
        code = 0
    except UsageError as err:
        parser.error(str(err))  # exit code 2, like argparse's own errors
    except (KeyboardInterrupt, OSError) as err:  # Ctrl-C, `kill`, `| head` closed the output
        go_on = safeguards.command_to_go_on("mnist_train.py", argv, "--resume")
        code = safeguards.stopped(err, run.on_disk(go_on, args.epochs)
                                  if safeguards.is_main_process() else "")  # rank 0 wrote it
    except FloatingPointError as err:  # the loss became NaN or inf
        print(f"error{rank}: {err} With this script: --lr {args.lr / 10:g} or --clip-grad 1.0. "
              f"{run.on_disk(None, args.epochs)}", file=sys.stderr)
    except (common.DataError, common.CheckpointError, common.OutputError) as err:
        print(f"error{rank}: {str(err).rstrip('.')}.", file=sys.stderr)
    finally:
        safeguards.leave_distributed(wait=code == 0)
    return code


def check_settings(args: argparse.Namespace, run: safeguards.RunFiles) -> None:
    """Refuse flags that do not go together, and files that cannot be written, before work."""
    model_sizes(args)
    if args.num_workers and args.loader == "memory":
        raise UsageError("--num-workers is for --loader dataloader; the in-memory loader needs "
                         "no worker processes")
    try:
        device = common.get_device(args.device)
    except ValueError as err:
        raise UsageError(f"--device: {err}") from None
    if args.compile and (problem := safeguards.compile_problem(device)):
        raise UsageError(f"--compile: {problem}; leave --compile out to train without it")
    files = {"--save-path": run.checkpoint, "its CSV": run.csv, "its mistakes picture":
             run.mistakes}
    if safeguards.is_main_process():  # the process that writes the files
        safeguards.check_outputs(files, "--tensorboard", args.tensorboard)


def resume(args: argparse.Namespace, parser, argv: list[str] | None,
           run: safeguards.RunFiles) -> None:
    """--resume: take the run's settings, and check that it can go on."""
    if args.dry_run:
        raise UsageError("--resume goes on with a real run; a --dry-run has nothing to resume")
    if not run.checkpoint.exists():
        raise UsageError(f"--resume: there is no run to resume at {run.checkpoint}: it saved no "
                         "epoch yet (start it again without --resume), or it was started with "
                         "another --save-path (or --model or --dataset): give that one")
    saved = safeguards.load_training_state(run, args, parser, argv, RUN_SETTINGS,
                                           may_change=("epochs",))
    done = run.last_epoch
    if args.schedule != "constant" and args.epochs != saved.epochs:  # planned over its epochs
        raise UsageError(f"--resume: this run's {args.schedule} learning rate was planned over "
                         f"{saved.epochs} epochs, so it cannot go on to {args.epochs}; leave "
                         "--epochs out, or start a new run")
    if args.epochs <= done:
        raise UsageError(f"--resume: this run's last saved epoch is {done}; pass --epochs with "
                         f"more than {done} to go on")
    if safeguards.is_main_process():
        print(f"resuming {run.checkpoint}: epochs {done + 1} to {args.epochs}")


if __name__ == "__main__":
    safeguards.run_script(main)
