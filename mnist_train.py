"""Train a small network on MNIST handwritten digits and keep the best model.

    python mnist_train.py --epochs 5               # the MLP: about 97.3-97.5% test accuracy
    python mnist_train.py --model cnn --epochs 5   # a small CNN: about 99%, slower on a CPU
    python mnist_train.py --dry-run                # one batch of each phase, to check the script
    python predict.py samples/photo_3.jpg          # then classify a picture (or your own)

What you should see (the MLP, in seconds; the README says how to read each line):

    PyTorch 2.14.1+cu130 | device cpu | mlp with 109,386 parameters | 55,000 train / ...
    epoch 1/5 | train loss 0.2850 | val loss 0.1802 | val acc 0.9422 | 0.4 s | saved best
    ...
    Test Accuracy: 0.9748 (9748/10000)      # 0.9730 to 0.9748, by CPU and thread count

This is mnist_minimal.py grown (read it first): train() is its main(), 1. data -> 2. model ->
3. loss -> 4. optimizer -> 5. loop -> 6. final test, plus what a real run adds, where it happens
(the README's ladder names each); its train() and test() became common.train_one_epoch and
common.evaluate. The details of each step follow train(); how a run starts and ends, last.
"""

import argparse
import copy
import gc
import os
import sys
import time
from functools import partial
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler

import common
from plumbing import augmentation, reports, safeguards
from plumbing.safeguards import RunFiles, UsageError


def train(args: argparse.Namespace, files: RunFiles) -> None:
    """The lesson: mnist_minimal.py's main(), grown into a real run."""
    device, amp_dtype, master_process = setup(args)  # MNIST downloaded, seeds, precision

    # 1. data ----------------------------------------------------------------------------------
    ## 60,000 training pictures (uint8 [N, 28, 28], labels 0..9), --val-size of them held out
    ## to pick the best epoch; 10,000 test pictures, used once at the end for an honest estimate.
    folder, classes = DATASETS[args.dataset]
    images, labels = common.load_mnist(args.data_dir, train=True, dataset=folder)
    test_images, test_labels = common.load_mnist(args.data_dir, train=False, dataset=folder)
    ## Inputs are standardised to a mean of 0 and a spread of 1, which the default weights and
    ## learning rate suit. predict.py must do the same: the saved model file keeps the two.
    mean, std = normalisation(args.dataset, images)
    train_idx, val_idx, test_idx = choose_splits(args, len(labels), len(test_labels))
    train_loader = make_loader(args, images[train_idx], labels[train_idx], mean=mean, std=std,
                               device=device, shuffle=True)
    val_loader = make_loader(args, images[val_idx], labels[val_idx], mean=mean, std=std,
                             device=device)
    test_loader = make_loader(args, test_images[test_idx], test_labels[test_idx], mean=mean,
                              std=std, device=device)

    # 2. model ---------------------------------------------------------------------------------
    model = common.build_model(args.model, **model_sizes(args)).to(device)  # random, by --seed

    # 3. loss ----------------------------------------------------------------------------------
    ## The model ends in 10 raw scores ("logits"): CrossEntropyLoss takes their log-softmax
    ## itself, so no softmax before it. (To predict a number, not a class: nn.MSELoss.)
    criterion = nn.CrossEntropyLoss()

    # 4. optimizer -----------------------------------------------------------------------------
    optimizer = make_optimizer(args.optimizer, model.parameters(), args.lr, device)
    ## What a real run adds, one line each; the README's ladder says why.
    steps = args.epochs * len(train_loader)  # optimizer steps in the whole run
    scheduler = make_schedule(args.schedule, optimizer, steps)  # None: a constant rate
    scaler = torch.amp.GradScaler(device.type, enabled=amp_dtype == torch.float16)  # else no-op
    ema = weight_average(model, optimizer, steps) if args.ema else None  # --ema
    if master_process:  # what to look at first when training misbehaves
        reports.sanity_report(model, val_loader, criterion, device, (train_idx, val_idx, test_idx))
    eval_model = model if ema is None else ema  # what is judged and saved: --ema's average
    state = {"model": model, "optimizer": optimizer, "scheduler": scheduler, "scaler": scaler,
             "ema": ema}  # what training changes: saved after every epoch, for --resume
    if args.compile:  # in place: training, and evaluation without --ema, run the compiled code
        model.compile()
    if common.process_count() > 1:  # torchrun: backward() averages every process's gradients
        model = nn.parallel.DistributedDataParallel(model)  # state, eval_model: the model inside

    # 5. training loop -------------------------------------------------------------------------
    about = {"model_name": args.model, "mean": mean, "std": std, "sizes": model_sizes(args),
             "classes": classes, "dataset": args.dataset}  # what predict.py needs beside weights
    start_epoch, best_epoch, best_acc, history = 1, 0, -1.0, []  # -1: any accuracy beats it
    if args.resume:  # go on after the last epoch saved, as if never stopped
        start_epoch, best_epoch, best_acc, history = safeguards.resume(files.last, state)
    with reports.open_tensorboard(args.tensorboard if master_process else None) as writer:
        for epoch in range(start_epoch, args.epochs + 1):
            start = time.perf_counter()
            train_loader.set_epoch(epoch)  # a new shuffle each epoch, from --seed + epoch
            train_loss = common.train_one_epoch(
                model, train_loader, criterion, optimizer, device, epoch=epoch, scaler=scaler,
                log_interval=args.log_interval, amp_dtype=amp_dtype, clip_grad=args.clip_grad,
                scheduler=scheduler, log=print if master_process else None)
            if not master_process:  # under torchrun the others only train; this one judges
                continue
            val_loss, val_acc = common.evaluate(eval_model, val_loader, criterion, device,
                                                amp_dtype=amp_dtype)
            seconds = time.perf_counter() - start
            ## Keep the model that does best on the validation pictures, not the last one:
            ## later epochs can overfit. The file predict.py loads changes only here.
            if val_acc > best_acc:
                best_epoch, best_acc = epoch, val_acc
                common.save_checkpoint(files.model, eval_model, epoch=epoch, val_accuracy=val_acc,
                                       **about)
            history.append([epoch, train_loss, val_loss, val_acc, seconds, best_epoch == epoch])
            safeguards.save_state(files.last, state, history, args, RUN_SETTINGS, **about)
            reports.write_history(files.csv, history, writer)  # last: the CSV follows the files
            print(f"epoch {epoch}/{args.epochs} | train loss {train_loss:.4f} | val loss "
                  f"{val_loss:.4f} | val acc {val_acc:.4f}{reports.rate(scheduler)} | "
                  f"{seconds:.1f} s" + (" | saved best" if best_epoch == epoch else ""))

    # 6. final test ----------------------------------------------------------------------------
    if not master_process:
        return
    ## The best model, reloaded from disk (proof that it loads), on pictures it has never seen.
    best_model, _ = common.load_model(files.model, device)
    guesses, truth = predict_all(best_model, test_loader, device, amp_dtype)  # for the matrix
    correct = int((guesses == truth).sum())
    print(f"best epoch {best_epoch} (val acc {best_acc:.4f}) saved to {files.model}; metrics in "
          f"{files.csv}")
    print(f"Test Accuracy: {correct / len(truth):.4f} ({correct}/{len(truth)})")
    reports.after_test(args, files.mistakes, classes, test_images[test_idx], guesses, truth,
                       history, len(train_idx))


# ---------------------------------------------------------------------------------------------
# The details of each step, in the order train() takes them.

## --dataset: torchvision's folder (DATA_DIR/<folder>/raw/) and class names; nothing else changes.
DATASETS = {
    "mnist": ("MNIST", reports.DIGITS),
    "fashion-mnist": ("FashionMNIST", ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                       "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]),
}


def setup(args: argparse.Namespace) -> tuple[torch.device, torch.dtype | None, bool]:
    """Join torchrun's processes (if any), fetch the data, seed, set how the maths run. Returns
    (device, --amp's 16-bit dtype or None, master_process: the one that prints and saves)."""
    device = common.get_device(args.device)  # "auto": the accelerator if there is one
    if args.device == "auto":  # an NVIDIA driver, but no GPU that this PyTorch can use? say so
        safeguards.note_missing_gpu(device)
    ## `torchrun --nproc_per_node=N mnist_train.py` starts N copies of this script, numbered
    ## ("ranked") 0 to N-1 in the RANK variable; each trains on its share of every batch
    ## (docs/distributed.md). A plain `python mnist_train.py` is one process, rank 0.
    rank = 0
    if "RANK" in os.environ:
        rank, device = safeguards.init_distributed(device)  # one GPU per process
    safeguards.download_mnist(args.data_dir, DATASETS[args.dataset][0])  # if not there yet
    ## Seeds weight initialisation, dropout and --augment; the loaders shuffle with their own
    ## generators, from --seed too. + rank: each process draws its own dropout and augmentation.
    common.set_seed(args.seed + rank)
    ## Precision. Float32 numbers below 1e-38 ("denormals"), which Adam makes in this MLP, are
    ## slow on many CPUs: read and written as 0, they change no weight (docs/speed.md).
    torch.set_flush_denormal(True)
    if device.type == "cuda":  # TF32: float32 matmuls on tensor cores, with a 10-bit mantissa
        torch.set_float32_matmul_precision("high")  # (Ampere and later): faster, close enough
    if args.deterministic:  # GPUs: the same numbers every run, a little slower
        safeguards.make_deterministic()
    ## --amp: matmuls in 16 bits, the weights kept in float32: bfloat16, or float16 on old GPUs.
    return device, safeguards.amp_dtype(args.amp, device), rank == 0


def normalisation(dataset: str, images: torch.Tensor) -> tuple[float, float]:
    """The mean and std of the training pictures' pixels (0..1), to standardise inputs with."""
    if dataset == "mnist":  # the values everyone uses: the same as computing them, rounded
        return common.MNIST_MEAN, common.MNIST_STD
    pixels = images.float().div_(255)
    return round(pixels.mean().item(), 4), round(pixels.std().item(), 4)


def choose_splits(args: argparse.Namespace, n_train: int,
                  n_test: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Indices of the training, validation and test pictures, after --subset and --dry-run."""
    if args.val_size >= n_train:
        raise UsageError(f"--val-size {args.val_size} leaves nothing to train on: the training "
                         f"set has {n_train} images")
    ## The split depends on --seed alone: every run with it validates on the same pictures.
    order = torch.randperm(n_train, generator=torch.Generator().manual_seed(args.seed))
    train_idx, val_idx = order[args.val_size :], order[: args.val_size]
    test_idx = torch.arange(n_test)
    if args.subset is not None and args.subset > len(train_idx):
        raise UsageError(f"--subset {args.subset} is larger than the {len(train_idx)} training "
                         "images left after the validation split")
    train_idx = train_idx[: args.subset]  # [:None] is all of them
    if args.dry_run:  # one batch of each (under torchrun: at most one in each process)
        train_idx = train_idx[: args.batch_size]
        val_idx, test_idx = val_idx[: args.test_batch_size], test_idx[: args.test_batch_size]
    return train_idx, val_idx, test_idx


def make_loader(args: argparse.Namespace, images: torch.Tensor, labels: torch.Tensor, *,
                mean: float, std: float, device: torch.device, shuffle: bool = False):
    """Batches of (standardised pictures, labels); for training, shuffled anew every epoch."""
    batch_size = args.batch_size if shuffle else args.test_batch_size
    augment = shuffle and args.augment  # training batches only: judge the pictures as they are
    if args.loader == "dataloader":  # not the default: see classic_loader() below
        return classic_loader(args, PictureDataset(images, labels, mean, std), batch_size,
                              device, shuffle, augment)
    ## The default: standardised once, on the training device; a batch is one indexing step.
    return common.TensorLoader(
        common.normalize_images(images, mean, std, device), labels.to(device), batch_size,
        shuffle=shuffle, seed=args.seed,
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


def classic_loader(args, dataset, batch_size, device, shuffle, augment):
    """--loader dataloader, the tool for data too big for memory: pictures read one at a time,
    in --num-workers background processes, and collated into batches."""
    ## pin_memory: batches in page-locked memory, which a GPU copies from faster.
    options = dict(num_workers=args.num_workers, persistent_workers=args.num_workers > 0,
                   pin_memory=device.type == "cuda")
    if not shuffle:  # evaluation: every picture, in order
        return DataLoader(dataset, batch_size, **options)
    ## DistributedSampler: each epoch's order from --seed + epoch, and under torchrun this
    ## process's share of it (without torchrun: a world of one process, which takes all).
    sampler = DistributedSampler(dataset, common.process_count(), common.process_rank(),
                                 seed=args.seed)
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
# The settings, and how a run starts and ends.

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
    add("--augment", action="store_true", help="random tilt, scale, width, shift, stroke width "
        "and writing styles on each training batch: reads people's own pictures better")
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
    add("--save-path", type=safeguards.file_path, help="the best model (default: checkpoints/"
        "mnist_<model>.pt), with the state for --resume (_last.pt), the metrics (.csv) and the "
        "mistakes (_mistakes.png) beside it; an earlier run's files are renamed, not replaced")
    add("--log-interval", type=positive(int), default=200, help="log the loss every N batches")
    add("--tensorboard", metavar="DIR", help="also log to DIR (pip install tensorboard)")
    add("--resume", action="store_true", help="go on with the run saved at --save-path, from "
        "its last epoch, with its settings (--epochs can grow)")
    add("--dry-run", action="store_true", help="one batch of each phase, then stop (for CI)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Check the command line and the files, train, and end with one line whatever happens.
    A first plain run passes every check and has nothing to set aside: main() is then
    parse_args() and train(); the rest is how a run that goes wrong ends."""
    safeguards.printable_output()  # Windows' cp1252 console: a path's letter it lacks, escaped
    parser = build_parser()
    args = parser.parse_args(argv)
    args.epochs = 1 if args.dry_run else args.epochs
    name = f"{'dry_run_' if args.dry_run else ''}{args.dataset.replace('-', '_')}_{args.model}.pt"
    files = RunFiles.beside(args.save_path or Path("checkpoints", name))
    master = safeguards.is_main_process()  # a plain run, or torchrun's process 0: it writes
    rank = f" (rank {os.environ['RANK']})" if "RANK" in os.environ else ""  # under torchrun
    kept, code = {}, 1
    try:
        with safeguards.stop_signals():  # `kill` and Ctrl-Break stop the run as Ctrl-C does
            check_settings(args, files)
            if args.resume:  # the saved run's settings, and whether it can go on
                safeguards.check_resume(args, parser, argv, files, RUN_SETTINGS)
            ## An earlier run's files are renamed, never replaced (dry_run_*.pt: by the next).
            if master and not args.resume and (args.save_path or not args.dry_run):
                safeguards.set_aside(files, kept)
            train(args, files)
            if sys.stdout is not None:  # None: started with stdout closed (`>&-`)
                sys.stdout.flush()  # here, where a closed output can still be caught
        code = 0
    except UsageError as err:
        parser.error(str(err))  # exit code 2, like argparse's own errors
    except (KeyboardInterrupt, OSError) as err:  # Ctrl-C, `kill`, `| head` closed the output
        go_on = safeguards.command_to_go_on("mnist_train.py", argv, "--resume")
        ending = safeguards.on_disk(files, kept, args.epochs, go_on) if master else ""
        code = safeguards.stopped(err, ending)  # process 0 wrote the files, and says what is there
    except FloatingPointError as err:  # the loss became NaN or inf
        print(f"error{rank}: {err} With this script: --lr {args.lr / 10:g} or --clip-grad 1.0. "
              f"{safeguards.on_disk(files, kept, args.epochs)}", file=sys.stderr)
    except (common.DataError, common.CheckpointError) as err:
        print(f"error{rank}: {str(err).rstrip('.')}.", file=sys.stderr)
    except common.OutputError as err:  # a full disk, say: what was saved before is still there
        print(f"error{rank}: {err} {safeguards.on_disk(files, kept, args.epochs)}", file=sys.stderr)
    except RuntimeError as err:  # torch.OutOfMemoryError included: its words, or a CPU's malloc's
        if not any(words in str(err) for words in ("out of memory", "you tried to allocate")):
            raise  # a bug: its traceback
        print(f"error{rank}: out of memory: lower --batch-size (now {args.batch_size}) or the "
              "model's size (--hidden, --channels). "
              f"{safeguards.on_disk(files, kept, args.epochs)}", file=sys.stderr)
    finally:
        if code != 0 and not files.model.exists():  # saved nothing: the earlier run's files
            for old, new in kept.items():  # go back where they were
                os.replace(new, old)
        safeguards.leave_distributed(wait=code == 0)
    return code


def check_settings(args: argparse.Namespace, files: RunFiles) -> None:
    """Refuse, before any work, flags that clash, sizes beyond memory and unwritable files."""
    sizes = model_sizes(args)
    if args.num_workers and args.loader == "memory":
        raise UsageError("--num-workers is for --loader dataloader; the in-memory loader needs "
                         "no worker processes")
    try:
        device = common.get_device(args.device)
    except ValueError as err:
        raise UsageError(f"--device: {err}") from None
    if args.compile and (problem := safeguards.compile_problem(device)):
        raise UsageError(f"--compile: {problem}; leave --compile out to train without it")
    safeguards.check_model_size(args, sizes, device)  # --hidden or --channels beyond memory
    if safeguards.is_main_process():  # the process that writes the files
        safeguards.check_outputs(files, "--tensorboard", args.tensorboard)


if __name__ == "__main__":
    gc.freeze()  # the imports' objects are never scanned by the collector again (docs/speed.md)
    sys.exit(main())
