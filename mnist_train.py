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
3. loss -> 4. optimizer -> 5. loop -> 6. final test, plus what a real run adds (the README's
ladder names each); its train() and test() became common.train_one_epoch and common.evaluate.
The details of each step follow train(), then the settings and main(). What only keeps a run
safe or reports on it (checks, files written whole, Ctrl-C, the printed reports) is in
plumbing/, called by names that say what they do: you need not open it.
"""

import argparse
import math
import sys
import time
from functools import partial

import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

import common
from plumbing import augmentation, files, reports, runs


def train(args: argparse.Namespace, paths: files.RunFiles) -> None:
    """The lesson: mnist_minimal.py's main(), grown into a real run."""
    device, amp_dtype, master_process = setup(args)  # torchrun, MNIST fetched, seeds, precision

    # 1. data ----------------------------------------------------------------------------------
    ## 60,000 training pictures (uint8 [N, 28, 28], labels 0..9), --val-size of them held out
    ## to pick the best epoch; 10,000 test pictures, used once at the end for an honest estimate.
    folder, classes = DATASETS[args.dataset]
    images, labels = files.load_mnist(args.data_dir, train=True, dataset=folder)
    test_images, test_labels = files.load_mnist(args.data_dir, train=False, dataset=folder)
    ## Inputs are standardised to a mean of 0 and a spread of 1, which the default weights and
    ## learning rate suit. predict.py must do the same: the saved model file keeps the two.
    mean, std = normalisation(args.dataset, images)
    train_idx, val_idx, test_idx = choose_splits(args, len(labels), len(test_labels))
    ## --augment: each training batch randomly warped (writing styles for digits only).
    augment = partial(augmentation.augment, styles=args.dataset == "mnist")  # augment(x, y)
    train_loader = InMemoryLoader(images[train_idx], labels[train_idx], args.batch_size, mean, std,
                                  device, args.seed, augment if args.augment else None)
    val_loader = InMemoryLoader(images[val_idx], labels[val_idx], args.test_batch_size, mean, std,
                                device)  # no seed: in order
    test_loader = InMemoryLoader(test_images[test_idx], test_labels[test_idx],
                                 args.test_batch_size, mean, std, device)

    # 2. model ---------------------------------------------------------------------------------
    sizes = runs.model_sizes(args)  # --hidden, --channels as keywords; {}: the model's own
    model = common.build_model(args.model, **sizes).to(device)  # random weights, from --seed

    # 3. loss ----------------------------------------------------------------------------------
    ## The model ends in 10 raw scores ("logits"): CrossEntropyLoss takes their log-softmax
    ## itself, so no softmax before it. (To predict a number, not a class: nn.MSELoss.)
    criterion = nn.CrossEntropyLoss()

    # 4. optimizer -----------------------------------------------------------------------------
    optimizer = make_optimizer(args.optimizer, model.parameters(), args.lr, device)
    steps = args.epochs * len(train_loader)  # optimizer steps in the whole run
    scheduler = make_schedule(args.schedule, optimizer, steps)  # None: a constant rate
    scaler = torch.amp.GradScaler(device.type, enabled=amp_dtype == torch.float16)  # else no-op
    ema = weight_average(model, optimizer, steps) if args.ema else None  # --ema
    if master_process:  # what to look at first when training misbehaves
        reports.sanity_report(model, val_loader, criterion, device, (train_idx, val_idx, test_idx))
    eval_model = model if ema is None else ema.module  # what is judged and saved: the model
    ## What training changes, each with its state_dict(): saved after every epoch for --resume.
    state = {"model": model, "optimizer": optimizer, "scheduler": scheduler, "scaler": scaler,
             "ema": None if ema is None else ema.module}
    if args.compile:  # in place: training, and evaluation without --ema, run the compiled code
        model.compile()
    ## torchrun: DistributedDataParallel (DDP) averages every process's gradients in backward().
    trained = nn.parallel.DistributedDataParallel(model) if runs.distributed() else model

    # 5. training loop -------------------------------------------------------------------------
    about = {"model_name": args.model, "mean": mean, "std": std, "sizes": sizes,
             "classes": classes, "dataset": args.dataset}  # what predict.py needs beside weights
    start_epoch, best_epoch, best_acc, history = 1, 0, -1.0, []  # -1: any accuracy beats it
    if args.resume:  # go on after the last epoch saved, as if never stopped
        start_epoch, best_epoch, best_acc, history = resume(paths.last, state)
    ## writer: a TensorBoard SummaryWriter with --tensorboard; None without.
    with reports.open_tensorboard(args.tensorboard if master_process else None) as writer:
        for epoch in range(start_epoch, args.epochs + 1):
            start = time.perf_counter()
            train_loader.epoch = epoch  # a new shuffle each epoch, from --seed + epoch
            train_loss = common.train_one_epoch(
                trained, train_loader, criterion, optimizer, device, epoch=epoch, scaler=scaler,
                log_interval=args.log_interval, amp_dtype=amp_dtype, clip_grad=args.clip_grad,
                scheduler=scheduler, log=print if master_process else None)
            ## torchrun: each process trained on its share; the epoch's loss is their mean.
            train_loss = runs.mean_over_processes(train_loss, device)  # plain: as it is
            if not master_process:  # under torchrun the others only train; this one judges
                continue
            val_loss, val_acc = common.evaluate(eval_model, val_loader, criterion, device,
                                                amp_dtype=amp_dtype)
            seconds = time.perf_counter() - start
            ## Keep the model that does best on the validation pictures, not the last one:
            ## later epochs can overfit. The file predict.py loads changes only here.
            if val_acc > best_acc:
                best_epoch, best_acc = epoch, val_acc
                with files.written_whole(paths.model) as f:  # a crash leaves the old file whole
                    torch.save({"state_dict": eval_model.state_dict(), "epoch": epoch,
                                "val_accuracy": val_acc, **about}, f)
            history.append([epoch, train_loss, val_loss, val_acc, seconds, best_epoch == epoch])
            if not args.dry_run:  # the state to go on from: one batch leaves nothing to go on
                files.save_state(paths.last, state, history, about, runs.settings(args))
            reports.write_history(paths.csv, history, writer)  # written after the model files
            print(f"epoch {epoch}/{args.epochs} | train loss {train_loss:.4f} | val loss "
                  f"{val_loss:.4f} | val acc {val_acc:.4f}{reports.scheduled_rate(scheduler)} | "
                  f"{seconds:.1f} s" + (" | saved best" if best_epoch == epoch else ""))

    # 6. final test ----------------------------------------------------------------------------
    if not master_process:
        return
    ## The best model, reloaded from its file (proof that it loads), on pictures never seen.
    best_model, _ = files.load_model(paths.model, device)  # (and the file's other keys)
    ## Each picture's guess (evaluate() only counts them), for the confusion matrix and mistakes.
    guesses, truth = reports.predict_all(best_model, test_loader, device, amp_dtype)
    correct = int((guesses == truth).sum())
    print(f"best epoch {best_epoch} (val acc {best_acc:.4f}) saved to {paths.model}; metrics in "
          f"{paths.csv}")
    print(f"Test Accuracy: {correct / len(truth):.4f} ({correct}/{len(truth)})")
    reports.after_test(args, paths.mistakes, classes, test_images[test_idx], guesses, truth,
                       history, len(train_idx))  # and a warning if it did not learn


# The details of each step, in the order train() takes them ---------------------------------------

## --dataset: torchvision's folder (DATA_DIR/<folder>/raw/) and class names; nothing else changes.
DATASETS = {
    "mnist": ("MNIST", [str(digit) for digit in range(10)]),
    "fashion-mnist": ("FashionMNIST", ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                       "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]),
}


def setup(args: argparse.Namespace) -> tuple[torch.device, torch.dtype | None, bool]:
    """Join torchrun's processes (if any), fetch the data, seed, set how the maths run. Returns
    (device, --amp's 16-bit dtype or None, master_process: the one that prints and saves)."""
    device = common.get_device(args.device)  # "auto": the accelerator if there is one
    runs.note_missing_gpu(device, args.device)  # an NVIDIA GPU this PyTorch cannot use?
    ## `torchrun --nproc_per_node=N mnist_train.py` starts N copies of this script, numbered
    ## ("ranked") 0 to N-1; each trains on its share of every epoch (docs/distributed.md), and
    ## process 0 alone judges, prints and saves. A plain `python mnist_train.py` is rank 0.
    rank, device = runs.join_torchrun(device)  # (0, device) without torchrun
    files.download_mnist(args.data_dir, DATASETS[args.dataset][0])  # if not there yet
    ## Seeds weight initialisation, dropout and --augment; the shuffles have their own
    ## generators, from --seed too. + rank: each process draws its own dropout and augmentation.
    common.set_seed(args.seed + rank)
    ## Precision. Float32 numbers below 1e-38 ("denormals"), which Adam makes in this MLP, are
    ## slow on many CPUs: read and written as 0, they change no weight (docs/speed.md).
    torch.set_flush_denormal(True)
    if device.type == "cuda":  # TF32: float32 matmuls on tensor cores, with a 10-bit mantissa
        torch.set_float32_matmul_precision("high")  # (Ampere and later): faster, close enough
    if args.deterministic:  # GPUs: the same numbers every run, a little slower
        runs.make_deterministic()
    ## --amp: matmuls in 16 bits, the weights kept in float32: bfloat16, or float16 on old GPUs.
    return device, runs.amp_dtype(args.amp, device), rank == 0


def normalisation(dataset: str, images: torch.Tensor) -> tuple[float, float]:
    """The mean and std of the training pictures' pixels (0..1), to standardise inputs with."""
    if dataset == "mnist":  # the values everyone uses: the same as computing them, rounded
        return common.MNIST_MEAN, common.MNIST_STD
    pixels = images.float().div_(255)
    return round(pixels.mean().item(), 4), round(pixels.std().item(), 4)


def choose_splits(args: argparse.Namespace, n_train: int,
                  n_test: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Indices of the training, validation and test pictures, after --subset and --dry-run."""
    runs.check_sizes(args, n_train)  # --val-size and --subset: within the pictures there are
    ## The split depends on --seed alone: every run with it validates on the same pictures.
    order = torch.randperm(n_train, generator=torch.Generator().manual_seed(args.seed))
    train_idx, val_idx = order[args.val_size :], order[: args.val_size]
    test_idx = torch.arange(n_test)
    train_idx = train_idx[: args.subset]  # [:None] is all of them
    if args.dry_run:  # one batch of each (under torchrun: at most one in each process)
        train_idx = train_idx[: args.batch_size]
        val_idx, test_idx = val_idx[: args.test_batch_size], test_idx[: args.test_batch_size]
    return train_idx, val_idx, test_idx


## The in-memory loader. mnist_minimal.py's DataLoader converts and stacks 64 pictures for every
## batch of every epoch: for a model this small, that costs more than the training. MNIST fits
## in memory, so each picture is converted once, on the training device; a batch is one index.
class InMemoryLoader:
    """Batches of (standardised pictures, labels), used as a DataLoader is. With a seed: in a
    new order every epoch (train() sets .epoch before each), else in order."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, batch_size: int, mean: float,
                 std: float, device: torch.device, seed: int | None = None,
                 transform=None) -> None:
        ## What ToTensor and Normalize do, for all at once: uint8 [N, 28, 28] to standardised
        ## float32 [N, 1, 28, 28]. The bytes travel first (4x less than float32); div_ and sub_
        ## (with _) work in place, without a copy.
        self.inputs = images.to(device).unsqueeze(1).float().div_(255).sub_(mean).div_(std)
        self.targets, self.batch_size = labels.to(device), batch_size
        self.seed, self.transform, self.epoch = seed, transform, 0  # transform: --augment's

    def order(self) -> torch.Tensor:
        """This epoch's order: a permutation from seed + epoch, the same in every process."""
        if self.seed is None:
            return torch.arange(len(self.targets))
        order = torch.randperm(len(self.targets),
                               generator=torch.Generator().manual_seed(self.seed + self.epoch))
        ## torchrun: process r takes every N-th index from the r-th, padded (as DistributedSampler
        ## pads) so that every process has as many batches: DDP waits for all at every step.
        world, rank = runs.world_and_rank()  # (1, 0) without torchrun
        return order.repeat(world)[: math.ceil(len(order) / world) * world][rank::world]

    def __len__(self) -> int:  # batches per epoch, in this process
        return math.ceil(len(self.order()) / self.batch_size)

    def __iter__(self):
        for idx in self.order().to(self.inputs.device).split(self.batch_size):
            batch = self.inputs.index_select(0, idx), self.targets.index_select(0, idx)
            yield batch if self.transform is None else self.transform(*batch)


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
                   total_steps: int) -> AveragedModel:
    """--ema: a copy of `model` (in .module) whose weights follow an average of its recent ones."""
    ## Late in training each step moves the weights a little around a good point, partly at
    ## random; an average of the recent weights sits nearer to it. This exponential moving
    ## average (average += (1 - decay) x (weights - average)) spans the last tenth of the run.
    ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(max(0.0, 1 - 10 / total_steps)))
    ema.update_parameters(model)  # the first update copies the weights; the next ones average
    optimizer.register_step_post_hook(lambda *_: ema.update_parameters(model))  # after step()
    return ema


## --resume: after every epoch, files.save_state() saves the last model and the state_dict() of
## everything else that training changes, beside the best model; resume() loads each one back.
def resume(path, state: dict) -> tuple[int, int, float, list]:
    """Load files.save_state()'s file back into `state`'s objects; return the epoch to go on
    with, the best epoch so far and its accuracy, and the history of epochs."""
    training = files.read_state(path)  # by name, the model's too; checked before any work
    with files.explain_misfit(path, "the model its settings describe",  # one line, if not
                              "start a new run without --resume"):
        for name, thing in state.items():
            if thing is not None:
                thing.load_state_dict(training[name])
    ## The CPU's random numbers (dropout, --augment) as they were; torchrun's keep their own.
    if not runs.distributed():
        torch.set_rng_state(training["rng"])
    best = max(training["history"], key=lambda row: row[3])  # the first epoch at the best
    return training["epoch"] + 1, best[0], best[3], training["history"]  # accuracy: saved


# The settings, and main() ----------------------------------------------------------------------

def build_parser() -> runs.ArgumentParser:
    parser = runs.ArgumentParser(description=__doc__.split("\n")[0])
    positive, add = runs.positive, parser.add_argument
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
    # system
    add("--device", default="auto", help="auto, cpu, cuda, cuda:1, mps, xpu")
    add("--amp", nargs="?", const="auto", choices=["auto", "bf16", "fp16"], help="mixed "
        "precision: --amp alone is bf16, or fp16 on GPUs without native bf16")
    add("--compile", action="store_true", help="torch.compile the model")
    add("--seed", type=runs.number_from(0, 2**32 - 1), default=42,
        help="same seed, same run (bit for bit on one CPU and thread count; GPUs: --deterministic)")
    add("--deterministic", action="store_true", help="bit-identical runs on a GPU too (slower)")
    # output
    add("--save-path", type=runs.file_path, help="the best model (default: checkpoints/"
        "mnist_<model>.pt), with the state for --resume (_last.pt), the metrics (.csv) and the "
        "mistakes (_mistakes.png) beside it; an earlier run's files are renamed, not replaced; "
        "a dry run's are named dry_run_*")
    add("--log-interval", type=positive(int), default=200, help="log the loss every N batches")
    add("--tensorboard", metavar="DIR", help="also log to DIR (pip install tensorboard)")
    add("--resume", action="store_true", help="go on with the run saved at --save-path, from "
        "its last epoch, with its settings (--epochs can grow)")
    add("--dry-run", action="store_true", help="one batch of each phase, then stop (for CI)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Read the command line, and train. runs.Run does the rest: checks before any work, the
    save path held, earlier runs kept, and one line that says what is on disk if a run fails."""
    parser = build_parser()
    args = parser.parse_args(argv)
    with runs.Run(args, parser, argv) as run:
        train(args, run.prepare(runs.model_sizes(args)))  # a model too big is refused
    return run.code


if __name__ == "__main__":
    sys.exit(main())
