"""Train a small network on MNIST handwritten digits and keep the best model.

    python mnist_train.py --epochs 5               # the MLP: about 97.5% test accuracy
    python mnist_train.py --model cnn --epochs 5   # a small CNN: aims at 98.8% or more
    python mnist_train.py --dry-run                # one batch of each phase, to check the script
    python predict.py my_digit.png                 # then classify your own picture

What you should see (MLP; the epoch times are from an overloaded 2-core VM, see the README):

    PyTorch 2.14.1 | device cpu | mlp with 109,386 parameters | 55,000 train / 5,000 val / ...
    ...
    Epoch 1 | Batch 200/860 | Loss 0.5262
    ...
    epoch 1/5 | train loss 0.2851 | val loss 0.1809 | val acc 0.9416 | 46.3 s | saved best
    ...
    Test Accuracy: 0.9745 (9745/10000)

The script follows the chain 1. data -> 2. model -> 3. loss -> 4. optimizer -> 5. training loop
-> 6. final test. The best epoch is chosen on a validation split held out from the training
images; the test set is used once, at the end, so its accuracy is an honest estimate.
"""

import signal
import sys

## Ctrl-C or `kill` while the imports below load (a few seconds) would print a long traceback.
## Exit with one line instead; main() installs the real handlers once they are loaded.
for _sig in (signal.SIGINT, signal.SIGTERM):
    signal.signal(_sig, lambda signum, frame: sys.exit("interrupted while starting up"))

import argparse
import csv
import math
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import default_collate

import common


def positive(kind):
    """argparse type: a positive int or float, with a readable error."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
        if not (value > 0 and math.isfinite(value)):
            raise argparse.ArgumentTypeError(f"must be greater than 0, got {text}")
        return value
    return parse


def device_type(name: str) -> torch.device:
    try:
        return common.get_device(name)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    # training
    parser.add_argument("--epochs", type=positive(int), default=5, help="passes over the data")
    parser.add_argument("--batch-size", type=positive(int), default=64,
                        help="images per training step; if you raise it, raise --lr too")
    parser.add_argument("--test-batch-size", type=positive(int), default=1000,
                        help="images per evaluation batch (no gradients, so it can be large)")
    parser.add_argument("--lr", type=positive(float), default=1e-3,
                        help="learning rate; if the loss turns NaN, divide it by 10")
    parser.add_argument("--optimizer", choices=["adam", "sgd"], default="adam",
                        help="adam converges with little tuning; sgd has momentum 0.9 "
                             "(try --lr 0.01)")
    parser.add_argument("--model", choices=sorted(common.MODELS), default="mlp")
    parser.add_argument("--augment", action="store_true",
                        help="random tilt, scale, shift and stroke width on each training batch: "
                             "better on people's own pictures (see predict.py)")
    parser.add_argument("--clip-grad", type=positive(float), default=None, metavar="MAX_NORM",
                        help="clip the gradient norm to this value (try 1.0 if the loss spikes)")
    # data
    parser.add_argument("--data-dir", default="./data", help="MNIST goes in DATA_DIR/MNIST/raw/")
    parser.add_argument("--val-size", type=positive(int), default=5000,
                        help="training images held out to pick the best epoch")
    parser.add_argument("--subset", type=positive(int), default=None, metavar="N",
                        help="train on only N images: a working loop can drive their loss to ~0")
    parser.add_argument("--loader", choices=["memory", "dataloader"], default="memory",
                        help="memory: batches cut from tensors decoded once (fast); dataloader: "
                             "the classic per-sample Dataset + DataLoader pipeline")
    parser.add_argument("--num-workers", type=int, default=0,
                        help="DataLoader worker processes (only with --loader dataloader)")
    # system
    parser.add_argument("--device", type=device_type, default="auto",
                        help="auto, cpu, cuda, cuda:1, mps, xpu")
    parser.add_argument("--amp", nargs="?", const="auto", choices=["auto", "bf16", "fp16"],
                        default=None, help="mixed precision: bf16, or fp16 with a GradScaler "
                        "(auto: bf16 on CPUs and on GPUs that support it, else fp16)")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model")
    parser.add_argument("--seed", type=int, default=42, help="same seed, same run")
    parser.add_argument("--deterministic", action="store_true",
                        help="bit-identical runs on a GPU too, at some cost in speed")
    # output
    parser.add_argument("--save-path", type=Path, default=None,
                        help="best checkpoint (default: checkpoints/mnist_<model>.pt, or "
                             "dry_run_<model>.pt); per-epoch metrics go next to it as .csv")
    parser.add_argument("--log-interval", type=positive(int), default=200,
                        help="print the training loss every N batches")
    parser.add_argument("--tensorboard", metavar="DIR", default=None,
                        help="also write TensorBoard logs to DIR (pip install tensorboard)")
    parser.add_argument("--dry-run", action="store_true",
                        help="one batch of train, validation and test, then stop (for CI)")
    return parser


def amp_dtype_for(choice: str | None, device: torch.device) -> torch.dtype | None:
    """Map --amp to a dtype. bfloat16 keeps float32's range, so it needs no GradScaler."""
    if choice is None:
        return None
    if choice == "auto":
        fp16_only = device.type == "cuda" and not torch.cuda.is_bf16_supported()
        choice = "fp16" if fp16_only else "bf16"
    return {"bf16": torch.bfloat16, "fp16": torch.float16}[choice]


def augment(images: torch.Tensor) -> torch.Tensor:
    """Randomly tilt, scale, shift, and thicken or thin the digits of a normalised batch."""
    ## Digits in people's pictures lean, sit a little off-centre after cropping, and come from
    ## thinner or thicker pens than MNIST's. Training on such variations makes the model robust
    ## to them. One affine warp for the whole batch (a different matrix per image) costs little
    ## next to the training step, and runs wherever the batch lives, GPU included.
    n, device = images.shape[0], images.device

    def uniform(limit):  # n random numbers in [-limit, limit]
        return (torch.rand(n, device=device) * 2 - 1) * limit

    angle, scale = uniform(math.radians(10)), 1 + uniform(0.1)
    shift_x, shift_y = uniform(2 / 14), uniform(2 / 14)  # +-2 pixels, in grid units of 14 px
    cos, sin = torch.cos(angle) / scale, torch.sin(angle) / scale
    theta = torch.stack([torch.stack([cos, -sin, shift_x], 1),
                         torch.stack([sin, cos, shift_y], 1)], 1)  # n x 2 x 3 affine matrices
    grid = F.affine_grid(theta, list(images.shape), align_corners=False)
    ## "border" repeats the edge pixels, which are background, so no dark frame appears.
    out = F.grid_sample(images, grid, padding_mode="border", align_corners=False)
    ## Stroke width: max-pooling spreads ink to neighbours (thicker), min-pooling removes edge
    ## pixels (thinner). A third of the batch gets each; mixing with the original keeps it mild.
    thicker = F.max_pool2d(out, 3, stride=1, padding=1)
    thinner = -F.max_pool2d(-out, 3, stride=1, padding=1)
    pick = torch.randint(0, 3, (n, 1, 1, 1), device=device)
    out = torch.where(pick == 1, (out + thicker) / 2, out)
    return torch.where(pick == 2, (out + thinner) / 2, out)


def collate_and_augment(samples: list) -> tuple[torch.Tensor, torch.Tensor]:
    """DataLoader collate_fn for --augment: stack the samples, then augment the batch."""
    inputs, targets = default_collate(samples)
    return augment(inputs), targets


def split_indices(n: int, val_size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Shuffle 0..n-1 with `seed`; return (train indices, validation indices)."""
    ## The split depends on the seed alone, so every run (and every rank) with the same seed
    ## validates on the same images.
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return order[val_size:], order[:val_size]


def make_loaders(args, images, labels, test_images, test_labels, splits, device, rank, world):
    """Return (train, val, test) loaders over the index splits, sharded across `world` ranks."""
    train_idx, val_idx, test_idx = splits
    if args.loader == "memory":
        ## Decode and normalise every image once, into one tensor on the training device.
        def tensors(imgs, idx):
            return common.normalize_images(imgs[idx], common.MNIST_MEAN, common.MNIST_STD, device)

        def loader(imgs, labs, idx, batch_size, shuffle):  # shuffle: this is the training set
            return common.TensorLoader(tensors(imgs, idx), labs[idx].to(device), batch_size,
                                       shuffle=shuffle, seed=args.seed, rank=rank,
                                       world_size=world,
                                       transform=augment if shuffle and args.augment else None)

        return (loader(images, labels, train_idx, args.batch_size, True),
                loader(images, labels, val_idx, args.test_batch_size, False),
                loader(test_images, test_labels, test_idx, args.test_batch_size, False))
    ## The classic pipeline: a Dataset turns one sample at a time into a tensor, and a DataLoader
    ## collates samples into batches, in num_workers background processes. It is the right tool
    ## when data does not fit in memory or needs random per-sample work such as augmentation.
    from torch.utils.data import DataLoader, DistributedSampler, Subset
    from torchvision import datasets
    from torchvision.transforms import v2

    transform = v2.Compose([v2.ToImage(), v2.ToDtype(torch.float32, scale=True),  # uint8 -> 0..1
                            v2.Normalize([common.MNIST_MEAN], [common.MNIST_STD])])
    train_set = datasets.MNIST(args.data_dir, train=True, transform=transform)
    test_set = datasets.MNIST(args.data_dir, train=False, transform=transform)
    options = dict(num_workers=args.num_workers, persistent_workers=args.num_workers > 0,
                   pin_memory=device.type == "cuda",  # page-locked memory: faster, async copies
                   worker_init_fn=common.seed_worker)
    train_subset = Subset(train_set, train_idx.tolist())
    if args.augment:  # in the worker processes, on CPU batches
        options["collate_fn"] = collate_and_augment
    if world > 1:  # each rank reads its own 1/world of every epoch's shuffled order
        sampler = DistributedSampler(train_subset, world, rank, shuffle=True, seed=args.seed)
        train = DataLoader(train_subset, args.batch_size, sampler=sampler, **options)
    else:
        train = DataLoader(train_subset, args.batch_size, shuffle=True,
                           generator=torch.Generator().manual_seed(args.seed), **options)
    ## Evaluation shards take every world-th image, without the padding DistributedSampler adds,
    ## so that the summed metrics cover each image exactly once.
    options.pop("collate_fn", None)  # never augment evaluation data
    return (train,
            DataLoader(Subset(train_set, val_idx[rank::world].tolist()), args.test_batch_size,
                       **options),
            DataLoader(Subset(test_set, test_idx[rank::world].tolist()), args.test_batch_size,
                       **options))


def sanity_report(args, model, loader, criterion, device, sizes) -> None:
    """Print what to look at first when training fails: versions, device, shapes, initial loss."""
    inputs, targets = next(iter(loader))
    with torch.no_grad():
        loss = criterion(model(inputs.to(device)), targets.to(device)).item()
    params = sum(p.numel() for p in model.parameters())
    print(f"PyTorch {torch.__version__} | device {device} | {args.model} with {params:,} parameters"
          f" | {sizes[0]:,} train / {sizes[1]:,} val / {sizes[2]:,} test images")
    def dtype(t):
        return str(t.dtype).removeprefix("torch.")
    print(f"batch: inputs {list(inputs.shape)} {dtype(inputs)} in [{inputs.min():.2f}, "
          f"{inputs.max():.2f}], labels {list(targets.shape)} {dtype(targets)} in "
          f"{targets.min()}..{targets.max()}")
    ## An untrained classifier spreads its bets evenly: p = 1/10 per class, loss = -ln(1/10).
    print(f"initial loss {loss:.4f} (an untrained 10-class model should be near ln(10) = "
          f"{math.log(10):.4f})")
    if not abs(loss - math.log(10)) < 1.0:
        print("warning: the initial loss is far from ln(10): check the labels (0..9), the "
              "input normalisation and the model's last layer (no softmax before the loss)")


def reduce_metrics(train_loss: float, loss: float, accuracy: float, count: int,
                   device: torch.device) -> tuple[float, float, float]:
    """Turn this rank's numbers into whole-dataset ones (unchanged in a plain run)."""
    ## Training shards are padded to equal sizes, so the mean of the ranks' means is exact.
    ## Evaluation shards differ by up to one image: sum the totals, then divide once.
    ranks, train_sum, loss_sum, correct, total = common.all_reduce_sum(
        [1.0, train_loss, loss * count, round(accuracy * count), count], device)
    return train_sum / ranks, loss_sum / total, correct / total


def train(args, parser) -> None:
    # system -----------------------------------------------------------------------------------
    ## Under torchrun this joins the other processes; in a plain run it returns (0, 1, device).
    rank, world, device = common.init_distributed(args.device)
    main_process = rank == 0  # only rank 0 prints, writes files and saves checkpoints
    log = print if main_process else None
    common.set_seed(args.seed + rank)  # ranks differ in dropout; DDP copies rank 0's weights
    if args.deterministic:
        ## On the CPU, runs with the same seed are already bit-identical. GPUs pick the fastest
        ## kernel, and some (atomic adds, cuDNN autotuning, cuBLAS split reductions) add floats
        ## in a varying order. This forbids those: ops without a deterministic version raise.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before the first matmul
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False
    if device.type == "cuda":
        ## TF32 runs float32 matmuls on tensor cores with a 10-bit mantissa: several times faster
        ## on Ampere and newer GPUs, and no visible change in accuracy for a model like this.
        torch.set_float32_matmul_precision("high")
    amp_dtype = amp_dtype_for(args.amp, device)
    ## A dry run must never replace a real checkpoint, so by default it saves under its own name.
    default_name = f"{'dry_run' if args.dry_run else 'mnist'}_{args.model}.pt"
    save_path = args.save_path or Path("checkpoints") / default_name

    # 1. data ----------------------------------------------------------------------------------
    images, labels = common.load_mnist(args.data_dir, train=True)
    test_images, test_labels = common.load_mnist(args.data_dir, train=False)
    common.check_batch(images, labels, 10)  # once, for all the data: labels must be 0..9
    common.check_batch(test_images, test_labels, 10)
    if args.val_size >= len(labels):
        parser.error(f"--val-size {args.val_size} leaves nothing to train on: the training set "
                     f"has {len(labels)} images")
    train_idx, val_idx = split_indices(len(labels), args.val_size, args.seed)
    if args.subset is not None:
        if args.subset > len(train_idx):
            parser.error(f"--subset {args.subset} is larger than the {len(train_idx)} training "
                         "images left after the validation split")
        train_idx = train_idx[: args.subset]
    test_idx = torch.arange(len(test_labels))
    epochs = args.epochs
    if args.dry_run:
        epochs, train_idx = 1, train_idx[: args.batch_size * world]
        val_idx, test_idx = val_idx[: args.test_batch_size], test_idx[: args.test_batch_size]
    splits = (train_idx, val_idx, test_idx)
    train_loader, val_loader, test_loader = make_loaders(
        args, images, labels, test_images, test_labels, splits, device, rank, world)
    del images, test_images  # the loaders hold what they need; free the raw bytes

    # 2. model ---------------------------------------------------------------------------------
    model = common.build_model(args.model).to(device)  # PyTorch's default init suits ReLU layers

    # 3. loss ----------------------------------------------------------------------------------
    criterion = nn.CrossEntropyLoss()  # log-softmax + negative log-likelihood, on raw logits

    # 4. optimizer -----------------------------------------------------------------------------
    optimizer = common.make_optimizer(args.optimizer, model.parameters(), args.lr, device)
    scaler = torch.amp.GradScaler(device.type) if amp_dtype == torch.float16 else None

    if main_process:
        sanity_report(args, model, val_loader, criterion, device, [len(i) for i in splits])
    raw_model = model  # evaluated directly: evaluation needs no gradient averaging
    if world > 1:
        ## DDP wraps the model: backward() now also averages gradients across ranks. Each step
        ## therefore sees world x --batch-size images (see "Scaling out" in the README).
        model = nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None)
    if args.compile:
        model = torch.compile(model)  # the first batches are slow while it compiles
        raw_model = torch.compile(raw_model) if world == 1 else raw_model

    writer = None
    if args.tensorboard and main_process:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            parser.error("--tensorboard needs the tensorboard package: pip install tensorboard")
        writer = SummaryWriter(args.tensorboard)

    # 5. training loop -------------------------------------------------------------------------
    csv_path = save_path.with_suffix(".csv")
    if main_process:
        save_path.parent.mkdir(parents=True, exist_ok=True)
        csv_file = open(csv_path, "w", newline="")
        metrics = csv.writer(csv_file)
        metrics.writerow(["epoch", "train_loss", "val_loss", "val_accuracy", "seconds", "saved"])
    best_acc, best_epoch = -1.0, 0
    for epoch in range(1, epochs + 1):
        start = time.perf_counter()
        if hasattr(train_loader, "set_epoch"):
            train_loader.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank
        elif hasattr(train_loader.sampler, "set_epoch"):
            train_loader.sampler.set_epoch(epoch)  # DistributedSampler: the same, for DataLoader
        train_loss = common.train_one_epoch(
            model, train_loader, criterion, optimizer, device, epoch=epoch,
            log_interval=args.log_interval, amp_dtype=amp_dtype, scaler=scaler,
            clip_grad=args.clip_grad, log=log)
        val_loss, val_acc = common.evaluate(raw_model, val_loader, criterion, device,
                                            amp_dtype=amp_dtype)
        train_loss, val_loss, val_acc = reduce_metrics(train_loss, val_loss, val_acc,
                                                       len(val_idx[rank::world]), device)
        seconds = time.perf_counter() - start
        ## Keep the epoch that does best on validation data, not the last one: later epochs can
        ## overfit. The save is atomic, so an interrupted save never damages the previous file.
        saved = val_acc > best_acc
        if saved:
            best_acc, best_epoch = val_acc, epoch
            if main_process:
                common.save_checkpoint(save_path, model, model_name=args.model,
                                       mean=common.MNIST_MEAN, std=common.MNIST_STD,
                                       epoch=epoch, val_accuracy=val_acc)
        if main_process:
            print(f"epoch {epoch}/{epochs} | train loss {train_loss:.4f} | val loss {val_loss:.4f}"
                  f" | val acc {val_acc:.4f} | {seconds:.1f} s" + (" | saved best" * saved))
            metrics.writerow([epoch, f"{train_loss:.6f}", f"{val_loss:.6f}", f"{val_acc:.6f}",
                              f"{seconds:.3f}", int(saved)])
            csv_file.flush()  # complete up to the last epoch, even if the run is interrupted
            if writer is not None:
                writer.add_scalars("loss", {"train": train_loss, "val": val_loss}, epoch)
                writer.add_scalar("accuracy/val", val_acc, epoch)
    if main_process:
        csv_file.close()
        if writer is not None:
            writer.close()

    # 6. final test, once, with the best model reloaded from disk --------------------------------
    if world > 1:
        torch.distributed.barrier()  # wait until rank 0 has written the checkpoint
    best_model, _ = common.load_model(save_path, device)
    test_loss, test_acc = common.evaluate(best_model, test_loader, criterion, device,
                                          amp_dtype=amp_dtype)
    _, _, test_acc = reduce_metrics(0.0, test_loss, test_acc, len(test_idx[rank::world]), device)
    if main_process:
        n = len(test_idx)
        print(f"best epoch {best_epoch} (val acc {best_acc:.4f}) saved to {save_path}; "
              f"metrics in {csv_path}")
        print(f"Test Accuracy: {test_acc:.4f} ({round(test_acc * n)}/{n})")


def _stop_on_sigterm(signum, frame):
    raise KeyboardInterrupt  # SIGTERM (e.g. `kill`, a job scheduler) unwinds like Ctrl-C


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    ## Ctrl-C raises KeyboardInterrupt; make SIGTERM (`kill`, job schedulers) do the same, so
    ## both unwind through the `except` below and any half-written file is cleaned up.
    previous = (signal.signal(signal.SIGINT, signal.default_int_handler),
                signal.signal(signal.SIGTERM, _stop_on_sigterm))
    try:
        train(args, parser)
    except KeyboardInterrupt:
        if common.is_main_process():
            print("\ninterrupted: stopped. Checkpoints already on disk are complete and load as "
                  "usual.", file=sys.stderr)
        return 130
    except (common.DataError, common.CheckpointError, common.NonFiniteLossError,
            common.OutputError) as err:
        rank = os.environ.get("RANK")  # under torchrun, say which process failed
        print(f"error{f' (rank {rank})' if rank else ''}: {err}", file=sys.stderr)
        return 1
    finally:
        common.cleanup_distributed()
        signal.signal(signal.SIGINT, previous[0])
        signal.signal(signal.SIGTERM, previous[1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
