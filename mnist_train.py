"""Train a small network on MNIST handwritten digits and keep the best model.

    python mnist_train.py --epochs 5               # the MLP: about 97.5% test accuracy
    python mnist_train.py --model cnn --epochs 5   # a small CNN: about 99%
    python mnist_train.py --dry-run                # one batch of each phase, to check the script
    python mnist_train.py --augment --ema --epochs 7    # reads people's own digits better
    python predict.py samples/photo_3.jpg          # then classify a picture (or your own)

What you should see (the MLP; about 7 s in all on a 2-core CPU, see the README):

    PyTorch 2.14.1 | device cpu | mlp with 109,386 parameters | 55,000 train / 5,000 val / ...
    ...
    Epoch 1 | Batch 200/860 | Loss 0.5262
    ...
    epoch 1/5 | train loss 0.2850 | val loss 0.1802 | val acc 0.9422 | 0.7 s | saved best
    ...
    Test Accuracy: 0.9748 (9748/10000)
    confusion matrix of the best model on the test set (rows: true digit, columns: predicted ...
    ...
    the first 64 of 252 mistakes, as pictures: checkpoints/mnist_mlp_mistakes.png

train() below is the lesson: 1. data -> 2. model -> 3. loss -> 4. optimizer -> 5. training loop
-> 6. final test. The best epoch is chosen on a validation split held out from the training
images; the test set is used once, at the end, so its accuracy is an honest estimate. The
helpers after train() hold the details of each step (how the loaders are built, which
optimizer) and the optional machinery (torchrun, compile, deterministic mode, the CSV and
TensorBoard logs, Ctrl-C): the lesson reads without opening them. The command-line settings
come last (`python mnist_train.py --help` lists them).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import csv
import gc
import importlib.util
import io
import math
import os
import shutil
import signal
import sys
import threading
import time
from functools import partial
from pathlib import Path

## Speed only: skip it on a first read. `import torch` creates some 180,000 Python objects
## (over 300,000 once the optimizer has imported torch._dynamo) that live until exit, and
## Python's cycle collector would walk them all, again and again, as they appear. So when
## this file is run as a script (not when it is imported), the collector is paused while they
## load; just after, they are frozen out of its sight (gc.freeze) so that later collections
## skip them too: about 0.4 s less per run ("Start-up" in the README).
if __name__ == "__main__":
    gc.disable()

## Ctrl-C while these load (`import torch` takes a second or two) ends the script with one
## line, as Ctrl-C does later, instead of a traceback from deep inside torch.
try:
    import torch
    from PIL import Image, ImageDraw, ImageFont
    from torch import nn
    from torch.utils.data import DataLoader, DistributedSampler, Subset

    import augmentation
    import common
    import run_files
    from common import positive, seed_number, worker_count  # argparse types
except KeyboardInterrupt:
    if __name__ != "__main__":  # imported (a notebook, the tests): the importer handles it
        raise
    print("\ninterrupted: stopped while starting up.", file=sys.stderr)
    sys.exit(130)
finally:
    if __name__ == "__main__":  # speed only (see above): freeze what loaded, collector on
        gc.freeze()
        gc.enable()


def train(args: argparse.Namespace, outputs: run_files.RunOutputs) -> None:
    """The lesson: data -> model -> loss -> optimizer -> training loop -> final test.

    `outputs` (run_files.RunOutputs, made by main()) names the files the run writes.
    """
    check_settings(args)  # flags that do not go together are refused before any work
    ## torchrun (several GPUs) starts one copy of this script per GPU; each copy is a "rank",
    ## 0 to world - 1. A plain `python mnist_train.py` is rank 0 of a world of 1.
    rank, world, device = setup_system(args)  # torchrun, seeding, deterministic mode, TF32
    main_process = rank == 0  # only rank 0 prints, writes files and saves checkpoints
    ## --amp (mixed precision): most of the maths in 16-bit floats, faster on GPUs.
    amp_dtype = amp_dtype_for(args.amp, device)  # None: plain float32
    save_path, csv_path = outputs.checkpoint, outputs.csv  # checkpoints/mnist_mlp.pt and .csv
    if main_process:
        check_outputs(outputs, args.tensorboard)  # before any work
    if args.compile and (problem := compile_problem(device)):
        raise UsageError(f"--compile: {problem}; leave --compile out to train without it")

    # 1. data ----------------------------------------------------------------------------------
    ## 60,000 training digits, of which --val-size are held out to pick the best epoch, and
    ## 10,000 test digits, used once at the end. Images are uint8 [N, 28, 28], labels 0..9.
    ## (--dataset fashion-mnist: the same numbers of pictures of clothes, in 10 classes.)
    folder, classes = DATASETS[args.dataset]
    images, labels = common.load_mnist(args.data_dir, train=True, dataset=folder)
    test_images, test_labels = common.load_mnist(args.data_dir, train=False, dataset=folder)
    ## Inputs are standardised to a mean of 0 and a spread of 1, the scale that the default
    ## weight initialisation and learning rate suit. predict.py must apply the same numbers,
    ## so they are saved in the checkpoint.
    mean, std = normalisation(args.dataset, images)  # of the 60,000 training pictures, 0..1
    splits = choose_splits(args, len(labels), len(test_labels), world)  # indices: train, val, test
    train_loader, val_loader, test_loader = make_loaders(
        args, images, labels, test_images, test_labels, splits, device, rank, world, (mean, std))
    del images  # the loaders hold what they need (test_images stay for the mistakes picture)

    # 2. model ---------------------------------------------------------------------------------
    sizes = model_sizes(args)  # e.g. {"hidden": [128, 64]}: --hidden and --channels
    model = common.build_model(args.model, **sizes).to(device)  # weights initialised as built

    # 3. loss ----------------------------------------------------------------------------------
    ## The model outputs 10 raw scores ("logits"); CrossEntropyLoss turns them into
    ## probabilities itself (log-softmax, then minus the true class's log-probability), so the
    ## model must not end with a softmax of its own. (To predict a number rather than a class,
    ## regression, the usual loss is nn.MSELoss: the mean squared difference.)
    criterion = nn.CrossEntropyLoss()

    # 4. optimizer -----------------------------------------------------------------------------
    optimizer = make_optimizer(args.optimizer, model.parameters(), args.lr, device)  # Adam, or SGD
    ## float16 has a narrow range: a GradScaler multiplies the loss before backward() so that
    ## small gradients do not round to zero, then divides them back before the step.
    scaler = torch.amp.GradScaler(device.type) if amp_dtype == torch.float16 else None
    ## --schedule warmup-cosine changes the learning rate after every batch; None: constant.
    epochs = 1 if args.dry_run else args.epochs
    scheduler = make_schedule(args.schedule, optimizer, epochs * len(train_loader))
    ## --ema: also keep a running average of the weights, which the optimizer updates after
    ## each of its steps, and evaluate and save that instead of the last step's weights
    ## (details at weight_average). None: no average.
    averaged = weight_average(model, optimizer, epochs * len(train_loader)) if args.ema else None
    eval_model = model if averaged is None else averaged  # the weights evaluated and saved

    ## Under --resume the sanity report skips the initial-loss check: the weights are still
    ## random here (the trained ones come back in step 5), and the check would describe them.
    if main_process:
        sanity_report(args.model, model, val_loader, criterion, device, [len(s) for s in splits],
                      untrained=not args.resume)
    ## `train_model` is `model`, wrapped in DDP under torchrun so that backward() also averages
    ## gradients across processes. Wrapping gives every rank rank 0's weights: the average
    ## starts from those too.
    train_model = prepare_for_training(model, args.compile, world, device)
    if averaged is not None:
        averaged.load_state_dict(model.state_dict())
    ## Speed only: the objects made so far, torch's and those of torch._dynamo (PyTorch's
    ## compiler, which torch.optim imports at the first optimizer), live until exit: frozen out
    ## of the cycle collector's sight, also when train() is called from a notebook ("Start-up"
    ## in the README). Garbage made later is still collected.
    gc.freeze()

    # 5. training loop -------------------------------------------------------------------------
    best_acc, best_epoch, history, first = -1.0, 0, [], 1
    if args.resume:  # go on after the last epoch saved: weights, optimizer, random numbers
        best_acc, best_epoch, history, first = run_files.resume_training(
            outputs.state, model, optimizer, scaler, scheduler, averaged, world)
    with open_tensorboard(args.tensorboard if main_process else None) as writer:
        for epoch in range(first, epochs + 1):
            start = time.perf_counter()
            ## The shuffle is seeded with --seed + epoch: the same order on every rank, and
            ## again after --resume. (DistributedSampler would not reshuffle without it.)
            train_loader.set_epoch(epoch)
            ## Each batch: forward, loss, backward(), step (the loop itself is in common.py).
            train_loss = common.train_one_epoch(
                train_model, train_loader, criterion, optimizer, device, epoch=epoch,
                log_interval=args.log_interval, amp_dtype=amp_dtype, scaler=scaler,
                clip_grad=args.clip_grad, scheduler=scheduler,
                log=print if main_process else None)
            val_loss, val_acc = common.evaluate(eval_model, val_loader, criterion, device,
                                                amp_dtype=amp_dtype)
            train_loss, val_loss, val_acc = reduce_metrics(  # torchrun: over all ranks
                train_loss, val_loss, val_acc, len(splits[1][rank::world]), world, device)
            ## Keep the epoch that does best on validation data, not the last one: later epochs
            ## can overfit. The save is atomic: an interrupted one leaves the previous file.
            saved = val_acc > best_acc
            if saved:
                best_acc, best_epoch = val_acc, epoch
            if main_process:
                seconds = time.perf_counter() - start
                history.append([epoch, f"{train_loss:.6f}", f"{val_loss:.6f}", f"{val_acc:.6f}",
                                f"{seconds:.3f}", int(saved)])
                with interrupts_deferred():  # no Ctrl-C between checkpoint, CSV and state
                    if saved:
                        ## At this run's first save, an earlier run's files at this path are
                        ## renamed with their date, never written over (a dry run replaces
                        ## an earlier dry run's file).
                        with outputs.keeping_earlier_run(epoch, val_acc):
                            common.save_checkpoint(save_path, eval_model, model_name=args.model,
                                                   mean=mean, std=std, epoch=epoch,
                                                   val_accuracy=val_acc, sizes=sizes,
                                                   dataset=args.dataset, classes=classes,
                                                   dry_run=args.dry_run)
                    record_history(csv_path, history, writer)
                    outputs.save_training_state(  # what --resume needs to go on from here:
                        {"epoch": epoch, "model": model.state_dict(),  # the weights trained on
                         "optimizer": optimizer.state_dict(),
                         "scaler": scaler.state_dict() if scaler else None,
                         "scheduler": scheduler.state_dict() if scheduler else None,
                         "ema": None if averaged is None else averaged.state_dict(),
                         "rng": torch.get_rng_state(), "best": (best_acc, best_epoch),
                         "history": history, "settings": run_files.run_settings(args)})
                lr = f" | lr {optimizer.param_groups[0]['lr']:.2e}" if scheduler else ""
                print(f"epoch {epoch}/{epochs} | train loss {train_loss:.4f} | val loss "
                      f"{val_loss:.4f} | val acc {val_acc:.4f}{lr} | {seconds:.1f} s"
                      + (" | saved best" if saved else ""))

    # 6. final test ----------------------------------------------------------------------------
    ## The best model, reloaded from disk (which also proves the checkpoint loads), on test
    ## images that played no part in choosing it. Rank 0 tests on the whole test set. One pass
    ## gives every guess; from them come the accuracy, which digits the model confuses, and a
    ## picture of its mistakes.
    if main_process:
        best_model, _ = common.load_model(save_path, device)
        guesses, truth = predict_all(best_model, test_loader, device, amp_dtype)
        correct = int((guesses == truth).sum())
        print(f"best epoch {best_epoch} (val acc {best_acc:.4f}) saved to {save_path}; "
              f"metrics in {csv_path}")
        print(f"Test Accuracy: {correct / len(truth):.4f} ({correct}/{len(truth)})")
        print(format_confusion_matrix(confusion_matrix(guesses, truth), classes))
        report_mistakes(outputs.mistakes, test_images[splits[2]], guesses, truth, args.dry_run,
                        classes)
        ## Near chance (below twice chance) on both validation and test: a validation set of a
        ## few images can be at 0 by bad luck alone, while the test accuracy shows the model
        ## learned. Runs on fewer than 1,000 images (a small --subset) get no verdict.
        chance = 2 / len(classes)
        if (not args.dry_run and len(splits[0]) >= 1000 and best_acc < chance
                and correct / len(truth) < chance):
            print(did_not_learn(best_acc, len(classes), args.lr, args.optimizer,
                                [float(row[1]) for row in history],  # the train losses
                                args.clip_grad))
    common.wait_for_all_ranks()  # under torchrun the others wait for rank 0's test, then all end


# ---------------------------------------------------------------------------------------------
# The helpers of train() (and of main()), grouped by what they are for.

## --dataset: torchvision's folder name (DATA_DIR/<folder>/raw/), and the class names. Both are
## 28x28 gray pictures in 10 classes, in the same file format: swapping one for the other
## changes the data, its normalisation and the names, and nothing in the model or the loop.
DATASETS = {
    "mnist": ("MNIST", [str(digit) for digit in range(10)]),
    "fashion-mnist": ("FashionMNIST", ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                       "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]),
}


def setup_system(args: argparse.Namespace) -> tuple[int, int, torch.device]:
    """Join torchrun's processes (if any), seed, and set denormals, deterministic mode, TF32."""
    ## Speed only, on the CPU: float32 numbers below about 1e-38 ("denormals") took 17-22x
    ## longer per operation on the Intel CPU this was measured on. Training makes them: a ReLU
    ## unit that no image turns on gets gradients of 0, and Adam's running average of them
    ## decays to 4 x 2^-149, where 0.9 x that rounds back to itself, so every later step
    ## computes with thousands of denormals. Flushed to 0, they changed no weight of the
    ## README's runs (its "Speed" section). Set before any tensor maths: on Linux, torch's
    ## worker threads copy it from this thread when they start (on macOS or Windows they may
    ## not, which only loses part of the gain).
    torch.set_flush_denormal(True)
    device = common.get_device(args.device)  # "auto": the accelerator if there is one
    if args.device == "auto" and device.type == "cpu" and (note := missing_gpu_note()):
        if os.environ.get("RANK", "0") == "0":  # one note, not one per process under torchrun
            print(note)
    try:
        rank, world, device = common.init_distributed(device)  # (0, 1, device) without torchrun
    except ValueError as err:  # a machine that cannot run this under torchrun
        raise UsageError(str(err)) from None
    ## Seeds weight initialisation and dropout; the loaders shuffle with their own generators,
    ## seeded from --seed too. + rank: each rank draws different dropout and augmentation; the
    ## weights still start equal, as DDP copies rank 0's to the other ranks.
    common.set_seed(args.seed + rank)
    if args.deterministic:
        make_deterministic()
    if device.type == "cuda":
        ## TF32 runs float32 matmuls on tensor cores with a 10-bit mantissa: several times faster
        ## on Ampere and newer GPUs, and no visible change in accuracy for a model like this.
        torch.set_float32_matmul_precision("high")
    return rank, world, device


def missing_gpu_note() -> str | None:
    """A note for when no accelerator is usable although an NVIDIA driver is installed."""
    ## The tool that comes with the driver is looked up, never run: running it takes seconds.
    if shutil.which("nvidia-smi") is None:
        return None
    if torch.version.cuda is None:
        return ("note: an NVIDIA driver is installed (nvidia-smi), but this PyTorch "
                f"({torch.__version__}) is a CPU-only build, so this runs on the CPU. For the "
                "GPU, install PyTorch's CUDA build: the command for your system is on "
                "https://pytorch.org/get-started/locally/ (on Windows, pip's default is CPU-only)")
    return (f"note: an NVIDIA driver is installed (nvidia-smi) and this PyTorch is built for CUDA "
            f"{torch.version.cuda}, but it finds no usable GPU, so this runs on the CPU. Run "
            "nvidia-smi: if it fails, reinstall the driver; if it works, the driver may be too "
            f"old for CUDA {torch.version.cuda}, or CUDA_VISIBLE_DEVICES hides the GPU")


def make_deterministic() -> None:
    """Forbid the GPU kernels whose results vary from run to run (see the README)."""
    ## On the CPU, runs with the same seed are already bit-identical. GPUs pick the fastest
    ## kernel, and some (atomic adds, cuDNN autotuning, cuBLAS split reductions) add floats in
    ## a varying order. This forbids those: an op without a deterministic version then raises.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before the first matmul
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False


def amp_dtype_for(choice: str | None, device: torch.device) -> torch.dtype | None:
    """Map --amp to a dtype. bfloat16 keeps float32's range, so it needs no GradScaler."""
    if choice is None:
        return None
    if choice == "auto":
        choice = "bf16" if native_bf16(device) else "fp16"
    if choice == "fp16" and device.type == "mps":  # float16 needs a GradScaler (step 4)
        raise UsageError("--amp fp16 on mps: float16 training needs a GradScaler, which "
                         "PyTorch's MPS backend does not support reliably; use --amp bf16 "
                         "(macOS 14 or later)")
    return {"bf16": torch.bfloat16, "fp16": torch.float16}[choice]


def native_bf16(device: torch.device) -> bool:
    """Whether bfloat16 is the right 16-bit type for `device` (False: use float16 instead)."""
    if device.type != "cuda":
        return True  # CPUs, Apple and Intel GPUs: bfloat16, whose range needs no GradScaler
    if torch.version.hip:  # AMD GPUs: ask ROCm about the GPU in question
        with torch.cuda.device(device):
            return torch.cuda.is_bf16_supported()
    ## Not torch.cuda.is_bf16_supported(): it also says True where bfloat16 is only emulated
    ## (T4, V100, RTX 20xx: slower than float32, and no bfloat16 convolutions in cuDNN), and
    ## it asks about the current GPU, not about `device`. Native bfloat16 came with Ampere.
    return torch.cuda.get_device_capability(device) >= (8, 0)


def normalisation(dataset: str, images: torch.Tensor) -> tuple[float, float]:
    """The mean and std of the training file's pixels (0..1) that inputs are standardised with."""
    if dataset == "mnist":  # the values everyone uses: the same as computing them, rounded
        return common.MNIST_MEAN, common.MNIST_STD
    pixels = images.float().div_(255)
    return round(pixels.mean().item(), 4), round(pixels.std().item(), 4)


def check_settings(args: argparse.Namespace) -> None:
    """Raise UsageError for flags that do not go together."""
    model_sizes(args)  # --hidden and --channels must fit --model
    if args.num_workers and args.loader == "memory":  # batches are tensor slices: no workers
        raise UsageError("--num-workers is for --loader dataloader; the in-memory loader needs "
                         "no worker processes")


def model_sizes(args: argparse.Namespace) -> dict:
    """The model's sizes from --hidden and --channels, as build_model() takes them."""
    if args.model == "mlp":
        if args.channels is not None:
            raise UsageError("--channels is for --model cnn; the MLP has --hidden only")
        return {"hidden": args.hidden or [128, 64]}
    if args.hidden is not None and len(args.hidden) != 1:
        raise UsageError("--model cnn has one hidden linear layer: give --hidden one size")
    if args.channels is not None and len(args.channels) != 2:
        raise UsageError("--model cnn has two convolutions: give --channels two sizes")
    return {"channels": args.channels or [16, 32],
            "hidden": args.hidden[0] if args.hidden else 128}


def checkpoint_path(args: argparse.Namespace) -> Path:
    """--save-path, or a default name; a dry run never replaces a real checkpoint."""
    data = "" if args.dataset == "mnist" else args.dataset.replace("-", "_") + "_"
    default_name = (f"dry_run_{data}{args.model}.pt" if args.dry_run
                    else f"{data or 'mnist_'}{args.model}.pt")
    return args.save_path or Path("checkpoints") / default_name


def check_outputs(outputs: run_files.RunOutputs, tensorboard: str | None) -> None:
    """Refuse, before any data is loaded, output paths that could not be written."""
    files = {"--save-path": outputs.checkpoint, "its CSV": outputs.csv}
    if not outputs.dry_run:
        files["its mistakes picture"] = outputs.mistakes
    if outputs.checkpoint.suffix.lower() == ".csv":  # .CSV too: Windows and macOS ignore case
        raise UsageError(f"--save-path {outputs.checkpoint}: the metrics go to {outputs.csv}; "
                         "give the checkpoint another suffix, such as .pt")
    for what, path in files.items():
        problem = common.check_output_file(path)
        if problem is None:
            continue
        if "not a regular file" in problem:  # such as /dev/null, meant as "keep nothing"
            problem += (". To keep nothing, save into a temporary folder instead, e.g. "
                        "--save-path /tmp/mnist/model.pt: the final test reloads the model")
        raise UsageError(f"{what} {path}{' ' if problem.startswith('is ') else ': '}{problem}")
    if tensorboard is not None:
        ## Its own folder: not '' (TensorBoard would pick ./runs/...), not one of the run's files.
        own = {os.path.abspath(p).casefold() for p in (outputs.checkpoint, outputs.csv,
                                                       outputs.mistakes, outputs.resume)}
        if not tensorboard.strip() or os.path.abspath(tensorboard).casefold() in own:
            raise UsageError(f"--tensorboard {tensorboard!r}: give it a folder of its own, such "
                             "as runs/mnist")
        if importlib.util.find_spec("tensorboard") is None:
            raise UsageError("--tensorboard needs the tensorboard package: pip install "
                             "tensorboard")
        if problem := common.check_output_dir(tensorboard):
            raise UsageError(f"--tensorboard {tensorboard}: {problem}")


def choose_splits(args: argparse.Namespace, n_train: int, n_test: int,
                  world: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Indices of the training, validation and test images, after --subset and --dry-run."""
    if args.val_size >= n_train:
        raise UsageError(f"--val-size {args.val_size} leaves nothing to train on: the training "
                         f"set has {n_train} images")
    train_idx, val_idx = split_indices(n_train, args.val_size, args.seed)
    if args.subset is not None:
        if args.subset > len(train_idx):
            raise UsageError(f"--subset {args.subset} is larger than the {len(train_idx)} "
                             "training images left after the validation split")
        train_idx = train_idx[: args.subset]
    test_idx = torch.arange(n_test)
    if args.dry_run:  # one batch of each, on every rank
        train_idx = train_idx[: args.batch_size * world]
        val_idx, test_idx = val_idx[: args.test_batch_size], test_idx[: args.test_batch_size]
    return train_idx, val_idx, test_idx


def split_indices(n: int, val_size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Shuffle 0..n-1 with `seed`; return (train indices, validation indices)."""
    ## The split depends on the seed alone, so every run (and every rank) with the same seed
    ## validates on the same images.
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return order[val_size:], order[:val_size]


def make_loaders(args, images, labels, test_images, test_labels, splits, device, rank, world,
                 normalise=(common.MNIST_MEAN, common.MNIST_STD)):
    """Return (train, val, test) loaders; train and val are sharded across `world` ranks."""
    train_idx, val_idx, test_idx = splits
    mean, std = normalise
    digits = args.dataset == "mnist"  # augment(styles=): handwriting styles are for digits
    if args.loader == "memory":
        ## Decode and normalise every image once, into one tensor on the training device.
        def loader(imgs, labs, idx, batch_size, shuffle=False, rank=rank, world=world):
            inputs = common.normalize_images(imgs[idx], mean, std, device)
            return common.TensorLoader(inputs, labs[idx].to(device), batch_size, shuffle=shuffle,
                                       seed=args.seed, rank=rank, world_size=world,
                                       transform=partial(augmentation.augment, styles=digits)
                                       if shuffle and args.augment else None)

        return (loader(images, labels, train_idx, args.batch_size, shuffle=True),
                loader(images, labels, val_idx, args.test_batch_size),
                loader(test_images, test_labels, test_idx, args.test_batch_size, rank=0, world=1))
    ## The classic pipeline: a Dataset turns one sample at a time into a tensor, and a DataLoader
    ## collates samples into batches, in num_workers background processes. It is the right tool
    ## when data does not fit in memory or needs random per-sample work.
    from torchvision import datasets
    from torchvision.transforms import v2

    transform = v2.Compose([v2.ToImage(), v2.ToDtype(torch.float32, scale=True),  # uint8 -> 0..1
                            v2.Normalize([mean], [std])])
    dataset = getattr(datasets, DATASETS[args.dataset][0])  # datasets.MNIST, or FashionMNIST
    train_set = dataset(args.data_dir, train=True, transform=transform)
    test_set = dataset(args.data_dir, train=False, transform=transform)
    ## pin_memory: batches in page-locked memory, which a GPU copies from faster. (Big batches
    ## also gain from .to(device, non_blocking=True), which overlaps the copy with the GPU's
    ## work; an MNIST batch is 200 KB, tens of microseconds to copy, so the loop keeps .to().)
    options = dict(num_workers=args.num_workers, persistent_workers=args.num_workers > 0,
                   pin_memory=device.type == "cuda")
    train_subset = Subset(train_set, train_idx.tolist())
    ## DistributedSampler gives each rank its 1/world of every epoch's shuffled order (all of it
    ## when world is 1); its set_epoch() makes the new order each epoch.
    sampler = DistributedSampler(train_subset, world, rank, shuffle=True, seed=args.seed)
    train = EpochDataLoader(train_subset, args.batch_size, sampler=sampler,
                            collate_fn=partial(augmentation.collate_and_augment, styles=digits)
                            if args.augment else None, **options)
    ## Evaluation shards take every world-th image, without the padding DistributedSampler adds,
    ## so that the summed metrics cover each image exactly once.
    return (train,
            DataLoader(Subset(train_set, val_idx[rank::world].tolist()), args.test_batch_size,
                       **options),
            DataLoader(Subset(test_set, test_idx.tolist()), args.test_batch_size, **options))


class EpochDataLoader(DataLoader):
    """A DataLoader with TensorLoader's set_epoch(), which it passes on to its sampler."""

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)


def make_optimizer(name: str, params, lr: float, device: torch.device) -> torch.optim.Optimizer:
    """Return Adam or SGD (momentum 0.9), fused into one kernel on devices that support it."""
    ## "Fused" updates all parameters in one kernel instead of several small operations per
    ## weight tensor: the same arithmetic, much less overhead, which matters for small models.
    fused = device.type in ("cpu", "cuda", "mps", "xpu")
    if name == "adam":  # adapts a step size per weight: the forgiving default
        return torch.optim.Adam(params, lr=lr, fused=fused)
    if name == "sgd":  # with momentum; often generalises a little better once lr is tuned
        return torch.optim.SGD(params, lr=lr, momentum=0.9, fused=fused)
    raise ValueError(f"unknown optimizer {name!r}; choose adam or sgd")


def make_schedule(name: str, optimizer: torch.optim.Optimizer, total_steps: int):
    """None for a constant learning rate, or a schedule to step once per batch."""
    if name == "constant":
        return None
    ## Warmup + cosine: over the first tenth of the steps the rate climbs to --lr (early steps,
    ## from random weights and with Adam's running averages still poor, can throw the model
    ## somewhere bad), then it falls along a cosine to 0, so the model settles. PyTorch's own
    ## schedulers in sequence; synthetic_train.py writes the same curve out by hand.
    warmup = max(1, total_steps // 10)
    schedulers = torch.optim.lr_scheduler
    return schedulers.SequentialLR(optimizer, [
        schedulers.LinearLR(optimizer, start_factor=1 / warmup, total_iters=warmup),
        schedulers.CosineAnnealingLR(optimizer, T_max=max(1, total_steps - warmup))],
        milestones=[warmup])


def weight_average(model: nn.Module, optimizer: torch.optim.Optimizer,
                   total_steps: int) -> nn.Module:
    """--ema: a copy of `model` whose weights follow the average of its recent weights."""
    ## Late in training, each step moves the weights a little around a good point, partly at
    ## random (each batch pulls its own way); an average of the recent weights sits nearer to
    ## that point. So the averaged model is usually a little more accurate than the last step's,
    ## and varies less from one --seed to the next. It costs a copy of the weights and one
    ## small update per step. (torch.optim.swa_utils.AveragedModel does the same, with more
    ## options, at twice the cost per step for a model this small.)
    averaged = copy.deepcopy(model).requires_grad_(False)  # trained only through the average
    ## An exponential moving average (EMA): after each step the average moves a fraction
    ## 1 - decay of the way to the new weights. This decay makes it span about the last tenth
    ## of the run, so that at the end the random weights it started from count for e^-10 at
    ## most, however long the run. (Runs of 10 steps or fewer: decay 0, no averaging. A run
    ## resumed with more --epochs averages over a tenth of its new length from then on.)
    decay = max(0.0, 1 - 10 / total_steps)
    ## Every weight, and BatchNorm's running statistics if there are any (buffers), paired
    ## with the model's; a weight shared by two layers is listed once, so it moves once.
    pairs = list(zip([*averaged.parameters(), *averaged.buffers()],
                     [*model.parameters(), *model.buffers()]))

    @torch.no_grad()
    def update(*_) -> None:
        for average, current in pairs:
            if average.is_floating_point():
                average.lerp_(current, 1 - decay)  # average + (1 - decay) * (current - average)
            else:  # a counter, such as BatchNorm's num_batches_tracked
                average.copy_(current)

    ## The training loop stays as it is: the optimizer calls update() after each of its steps.
    optimizer.register_step_post_hook(update)
    return averaged


def sanity_report(model_name, model, loader, criterion, device, sizes, untrained=True) -> None:
    """Print what to look at first when training fails: versions, device, shapes, and the
    initial loss of an `untrained` model."""
    inputs, targets = next(iter(loader))
    params = sum(p.numel() for p in model.parameters())
    print(f"PyTorch {torch.__version__} | device {device} | {model_name} with {params:,} "
          f"parameters | {sizes[0]:,} train / {sizes[1]:,} val / {sizes[2]:,} test images")

    def dtype(t):
        return str(t.dtype).removeprefix("torch.")

    print(f"a validation batch: inputs {list(inputs.shape)} {dtype(inputs)} in "
          f"[{inputs.min():.2f}, {inputs.max():.2f}], labels {list(targets.shape)} "
          f"{dtype(targets)} in {targets.min()}..{targets.max()}")
    if not untrained:
        return
    with torch.no_grad():
        loss = criterion(model(inputs.to(device)), targets.to(device)).item()
    ## An untrained classifier spreads its bets evenly: p = 1/10 per class, loss = -ln(1/10).
    print(f"initial loss {loss:.4f} (an untrained 10-class model should be near ln(10) = "
          f"{math.log(10):.4f})")
    if not abs(loss - math.log(10)) < 1.0:
        print("warning: the initial loss is far from ln(10): check the labels (0..9), the "
              "input normalisation and the model's last layer (no softmax before the loss)")


def did_not_learn(best_acc: float, classes: int, lr: float, optimizer: str,
                  train_losses: list[float], clip_grad: float | None = None) -> str:
    """The warning for a run that stayed near chance, with what to check, in order."""
    ## Which way is the learning rate off? Too high, the steps overshoot and the loss jumps far
    ## above ln(classes), where an untrained model starts. Otherwise, a rate outside the range
    ## that usually works for the optimizer is the first suspect.
    start, worst = math.log(classes), max(train_losses)
    low, high, usual = {"adam": (1e-4, 1e-2, "Adam's usual 1e-4 to 1e-2"),
                        "sgd": (1e-3, 1e-1, "SGD's usual 1e-3 to 1e-1")}[optimizer]
    if worst > 2 * start:
        rate = (f"the training loss reached {worst:.4g}, where an untrained model has ln({classes})"
                f" = {start:.2f}: --lr {lr:g} is too high, try --lr {lr / 10:g}")
    elif not low <= lr <= high:
        way, better = ("higher", lr / 10) if lr > high else ("lower", lr * 10)
        rate = f"--lr {lr:g} is {way} than {usual}: try --lr {better:g}"
    else:
        rate = (f"--lr {lr:g}: if the loss jumped, try --lr {lr / 10:g}; if it barely fell, "
                f"--lr {lr * 10:g}")
    ## Clipping shrinks SGD's steps with the gradients. Adam divides each gradient by its own
    ## running size, so its steps shrink only where the clipped gradients near its eps (1e-8).
    if clip_grad is not None and clip_grad < (1e-3 if optimizer == "sgd" else 1e-6):
        rate = f"--clip-grad {clip_grad:g} is so small that every step is nearly 0: try 1.0"

    return (f"warning: the best validation accuracy, {best_acc:.4f}, is near chance "
            f"({1 / classes:.2f} for {classes} classes): the model did not learn. Check, in this "
            f"order: the learning rate ({rate}); the labels (the sanity report shows their "
            "range); the input normalisation (its input range); and whether the loop can learn "
            "at all: with --subset 100 --epochs 50 the training loss should fall near 0.")


def prepare_for_training(model: nn.Module, compile: bool, world: int,
                         device: torch.device) -> nn.Module:
    """Compile `model` in place if asked; under torchrun, return it wrapped in DDP."""
    if compile:
        ## In place: training and evaluation run the compiled version (but not --ema's
        ## average, a copy made before this: it is evaluated uncompiled).
        model.compile()
    if world == 1:
        return model
    ## DDP's backward() also averages gradients across ranks, so each step sees
    ## world x --batch-size images (see "Scaling out" in the README). Evaluation and saving
    ## use the plain model: they need no gradient averaging.
    return nn.parallel.DistributedDataParallel(
        model, device_ids=[device.index] if device.type == "cuda" else None)


def compile_problem(device: torch.device) -> str | None:
    """Why torch.compile cannot work here, found before any work, or None."""
    ## torch.compile turns the model into new code that it then compiles: C++ on the CPU,
    ## Triton kernels on NVIDIA GPUs. Without a compiler it fails at the first forward pass.
    if device.type == "cuda" and importlib.util.find_spec("triton") is None:
        return ("it needs Triton for NVIDIA GPUs, which is not installed (PyTorch's Windows "
                "wheels do not include it)")
    if device.type == "cpu" and sys.platform == "win32" and shutil.which("cl") is None:
        return ("on Windows it needs Microsoft's C++ compiler (cl.exe, from Visual Studio's "
                "Build Tools); run from an 'x64 Native Tools Command Prompt' that has it")
    cxx = os.environ.get("CXX", "").split()  # the compiler torch.compile then uses, if set
    if device.type == "cpu" and sys.platform != "win32" and cxx and not shutil.which(cxx[0]):
        return (f"the C++ compiler that CXX names, {cxx[0]}, was not found: fix CXX, or unset "
                "it to let torch.compile look for g++ or clang++")
    compilers = [*cxx, *map(shutil.which, ("g++", "clang++", "c++"))]
    if device.type == "cpu" and sys.platform != "win32" and not any(compilers):
        return ("on the CPU it needs a C++ compiler, and none was found (install g++ or clang, "
                "e.g. with Xcode's command line tools on a Mac)")
    return None


def open_tensorboard(log_dir: str | None):
    """A TensorBoard SummaryWriter for log_dir, or, without one, a context that yields None."""
    if log_dir is None:
        return contextlib.nullcontext()
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(log_dir)


def reduce_metrics(train_loss: float, val_loss: float, val_acc: float, val_count: int,
                   world: int, device: torch.device) -> tuple[float, float, float]:
    """Turn this rank's numbers into whole-dataset ones (unchanged in a plain run)."""
    if world == 1:
        return train_loss, val_loss, val_acc
    ## Training shards are padded to equal sizes (a few images count twice), so the training
    ## loss is the mean of the ranks' means. Validation shards are not padded and differ by up
    ## to one image: sum the totals over ranks, then divide once, for the exact numbers.
    train_sum, loss_sum, correct, total = common.all_reduce_sum(
        [train_loss, val_loss * val_count, val_acc * val_count, val_count], device)
    return train_sum / world, loss_sum / total, correct / total


@contextlib.contextmanager
def interrupts_deferred():
    """Hold back Ctrl-C and SIGTERM until the block has finished, then raise KeyboardInterrupt."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread receives signals: there is nothing to hold back
        return
    received = []
    previous = {sig: signal.signal(sig, lambda signum, frame: received.append(signum))
                for sig in (signal.SIGINT, signal.SIGTERM, *STOP_SIGNALS)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if received:
        raise KeyboardInterrupt


def record_history(csv_path: Path, history: list[list], writer) -> None:
    """Rewrite the per-epoch CSV (atomically, like the checkpoint) and log to TensorBoard."""
    ## The whole file is rewritten after each epoch (and its checkpoint, if it saved one). A new run
    ## therefore leaves the previous run's CSV in place until it has saved its own first
    ## checkpoint, so the two come from the same run (unless this write fails: that ends the
    ## run with an error that says so).
    text = io.StringIO()
    rows = csv.writer(text)
    rows.writerow(["epoch", "train_loss", "val_loss", "val_accuracy", "seconds", "saved"])
    rows.writerows(history)
    common.write_atomically(csv_path, text.getvalue().encode())
    if writer is not None:
        epoch, train_loss, val_loss, val_acc = history[-1][:4]
        writer.add_scalars("loss", {"train": float(train_loss), "val": float(val_loss)}, epoch)
        writer.add_scalar("accuracy/val", float(val_acc), epoch)


def predict_all(model: nn.Module, loader, device: torch.device,
                amp_dtype: torch.dtype | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's guess for every image of `loader`, in order, and the true labels (on CPU)."""
    model.eval()
    guesses, truth = [], []
    with torch.inference_mode(), torch.autocast(device.type, dtype=amp_dtype,
                                                enabled=amp_dtype is not None):
        for inputs, targets in loader:
            guesses.append(model(inputs.to(device)).argmax(dim=1).cpu())
            truth.append(targets.cpu())
    return torch.cat(guesses), torch.cat(truth)


def confusion_matrix(guesses: torch.Tensor, truth: torch.Tensor, classes: int = 10) -> torch.Tensor:
    """counts[t, g]: how many images of class t the model called g (rows: the true class)."""
    return torch.bincount(truth * classes + guesses, minlength=classes**2).view(classes, classes)


def format_confusion_matrix(counts: torch.Tensor, names: list[str] | None = None) -> str:
    """The matrix as a table, with each class's accuracy and the most frequent confusions."""
    classes = len(counts)
    digits = names is None or names == DATASETS["mnist"][1]
    names = names or DATASETS["mnist"][1]
    kind = "digit" if digits else "class"
    lines = [f"confusion matrix of the best model on the test set (rows: true {kind}, columns: "
             f"predicted {kind})"]
    if not digits:  # the table has room for numbers only: say which class each one is
        lines.append("classes: " + ", ".join(f"{c} {name}" for c, name in enumerate(names)))
    lines.append("true |" + "".join(f"{g:>6}" for g in range(classes)) + " | correct")
    for t in range(classes):
        accuracy = counts[t, t] / counts[t].sum().clamp(min=1)
        lines.append(f"{t:>4} |" + "".join(f"{int(c):>6}" for c in counts[t])
                     + f" | {accuracy:7.1%}")
    off_diagonal = counts * (1 - torch.eye(classes, dtype=counts.dtype))
    top = off_diagonal.flatten().topk(3)
    pairs = [f"{names[int(i) // classes]} as {names[int(i) % classes]} ({int(n)}x)"
             for n, i in zip(top.values, top.indices) if n > 0]
    lines.append("most frequent mistakes: " + (", ".join(pairs) or "none"))
    return "\n".join(lines)


def report_mistakes(path: Path, images: torch.Tensor, guesses: torch.Tensor,
                    truth: torch.Tensor, dry_run: bool, names: list[str] | None = None,
                    limit: int = 64) -> None:
    """Save a labelled grid of the first `limit` misclassified images, and say where."""
    names = names or DATASETS["mnist"][1]
    wrong = (guesses != truth).nonzero().flatten()
    if dry_run:
        print("mistakes picture: not written in a dry run")
    elif len(wrong) == 0:
        print("no mistakes on the test set, so no mistakes picture")
    else:
        first = wrong[:limit]  # in test-set order, so the picture is the same every run
        tiles = [labelled_tile(images[i], names[int(truth[i])], names[int(guesses[i])])
                 for i in first]
        write_png(path, tile_grid(tiles, columns=8, gap=3))
        print(f"the first {len(first)} of {len(wrong)} mistakes, as pictures: {path}")


def labelled_tile(image: torch.Tensor, true: str, guess: str, scale: int = 4) -> Image.Image:
    """A uint8 28 x 28 picture, enlarged, above a caption such as "true 4, guess 9"."""
    digit = Image.frombytes("L", (28, 28), bytes(image.flatten().tolist()))
    size = 28 * scale
    tile = Image.new("L", (size, size + 24))  # black, like the digits' background
    tile.paste(digit.resize((size, size), Image.NEAREST))  # big, crisp pixels
    draw, caption = ImageDraw.Draw(tile), f"true {true}, guess {guess}"
    font = ImageFont.load_default(size=16)
    if draw.textlength(caption, font=font) > size - 4:  # long class names: two smaller lines
        caption, font = f"true {true}\nguess {guess}", ImageFont.load_default(size=11)
    draw.multiline_text((size / 2, size + 12), caption, fill=255, anchor="mm", align="center",
                        font=font, spacing=1)
    return tile


def tile_grid(tiles: list[Image.Image], columns: int, gap: int) -> Image.Image:
    """Tiles of one size in rows of `columns`, `gap` pixels of mid-gray around each."""
    w, h = tiles[0].size
    rows = math.ceil(len(tiles) / columns)
    grid = Image.new("L", (min(columns, len(tiles)) * (w + gap) + gap, rows * (h + gap) + gap),
                     128)
    for i, tile in enumerate(tiles):
        grid.paste(tile, (gap + (i % columns) * (w + gap), gap + (i // columns) * (h + gap)))
    return grid


def write_png(path: Path, image: Image.Image) -> None:
    """Encode a picture as PNG and write it atomically, like the checkpoint."""
    buffer = io.BytesIO()
    image.save(buffer, format="png")
    common.write_atomically(path, buffer.getvalue())


# ---------------------------------------------------------------------------------------------
# The command line: the settings, their checks, and how errors and Ctrl-C end a run.


def build_parser() -> argparse.ArgumentParser:
    ## allow_abbrev=False: argparse would take --epoch for --epochs, but --resume must know
    ## exactly which settings the command line gives (run_files.given_on_command_line).
    ## common.ArgumentParser is argparse's, but for --epoch it asks "did you mean --epochs?".
    parser = common.ArgumentParser(description=__doc__.split("\n")[0],
                                   formatter_class=common.HelpFormatter, allow_abbrev=False)
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
    parser.add_argument("--model", choices=sorted(common.MODELS), default="mlp",
                        help="mlp: a fully connected network, fast; cnn: a small convolutional "
                             "network, more accurate and several times slower on a CPU")
    parser.add_argument("--hidden", type=positive(int), nargs="+", default=None, metavar="N",
                        help="hidden layer sizes: the MLP's (default 128 64; e.g. --hidden 256 "
                             "128), or the CNN's one linear layer (default 128)")
    parser.add_argument("--channels", type=positive(int), nargs=2, default=None,
                        metavar=("C1", "C2"), help="the CNN's convolution widths (default 16 32)")
    parser.add_argument("--augment", action="store_true",
                        help="random tilt, scale, shift, stroke width and writing styles (a flag "
                             "on 1s, a bar on 7s, a tail turned left on 9s) on each training "
                             "batch: better on people's own pictures (see predict.py)")
    parser.add_argument("--schedule", choices=["constant", "warmup-cosine"], default="constant",
                        help="the learning rate: constant, or warmup-cosine (it climbs to --lr "
                             "over the first tenth of the steps, then falls to 0 along a cosine)")
    parser.add_argument("--ema", action="store_true",
                        help="evaluate and save a running average of the weights over about the "
                             "last tenth of the steps: usually a little more accurate, and "
                             "steadier from one seed to the next")
    parser.add_argument("--clip-grad", type=positive(float), default=None, metavar="MAX_NORM",
                        help="clip the gradient norm to this value (try 1.0 if the loss spikes)")
    # data
    parser.add_argument("--dataset", choices=sorted(DATASETS), default="mnist",
                        help="fashion-mnist: 28x28 pictures of clothes instead of digits, the "
                             "worked example of swapping the data")
    parser.add_argument("--data-dir", default="./data",
                        help="MNIST goes in DATA_DIR/MNIST/raw/, Fashion-MNIST in "
                             "DATA_DIR/FashionMNIST/raw/")
    parser.add_argument("--val-size", type=positive(int), default=5000,
                        help="training images held out to pick the best epoch")
    parser.add_argument("--subset", type=positive(int), default=None, metavar="N",
                        help="train on only N images: a working loop can drive their loss to ~0")
    parser.add_argument("--loader", choices=["memory", "dataloader"], default="memory",
                        help="memory: batches cut from tensors decoded once (fast); dataloader: "
                             "the classic per-sample Dataset + DataLoader pipeline")
    parser.add_argument("--num-workers", type=worker_count, default=0,
                        help="DataLoader worker processes (only with --loader dataloader)")
    # system
    parser.add_argument("--device", type=device_type, default="auto",
                        help="auto, cpu, cuda, cuda:1, mps, xpu")
    parser.add_argument("--amp", nargs="?", const="auto", choices=["auto", "bf16", "fp16"],
                        default=None, help="mixed precision: bf16, or fp16 with a GradScaler "
                        "(--amp alone is auto: bf16, except fp16 on GPUs without native bf16, "
                        "such as NVIDIA's before Ampere)")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model")
    parser.add_argument("--seed", type=seed_number, default=42,
                        help="same seed, same run (bit for bit on a CPU; GPUs: --deterministic)")
    parser.add_argument("--deterministic", action="store_true",
                        help="bit-identical runs on a GPU too, at some cost in speed")
    # output
    parser.add_argument("--save-path", type=file_name, default=None,
                        help="best checkpoint (default: checkpoints/mnist_<model>.pt, "
                             "fashion_mnist_<model>.pt, or dry_run_...); beside it go the "
                             "per-epoch metrics (.csv), the mistakes picture (_mistakes.png) and "
                             "the state --resume goes on from (_resume.pt); an earlier run's "
                             "files there are renamed, never replaced")
    parser.add_argument("--log-interval", type=positive(int), default=200,
                        help="print the training loss every N batches")
    parser.add_argument("--tensorboard", metavar="DIR", default=None,
                        help="also write TensorBoard logs to DIR (pip install tensorboard)")
    parser.add_argument("--resume", action="store_true",
                        help="go on with the interrupted (or finished) run saved at --save-path, "
                             "from its last epoch, with its settings; --epochs can grow (a "
                             "finished run needs more), except with --schedule warmup-cosine")
    parser.add_argument("--dry-run", action="store_true",
                        help="one batch of train, validation and test, then stop (for CI)")
    return parser


def device_type(name: str) -> str:
    """argparse type: the name of a device that exists here (see common.get_device)."""
    try:
        common.get_device(name)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return name


STOP_SIGNALS = (signal.SIGBREAK,) if hasattr(signal, "SIGBREAK") else ()  # Windows: Ctrl-Break


def file_name(text: str) -> Path:
    """argparse type for --save-path: a file's name, not a folder's (checkpoints/, ., '')."""
    ## Path("checkpoints/") drops the slash and Path("") is ".": check the text as typed.
    if text.endswith(("/", os.sep)) or Path(text).name in ("", ".", ".."):
        raise argparse.ArgumentTypeError(f"{text!r} names a folder, not a file: give a file's "
                                         "name, such as checkpoints/model.pt")
    return Path(text)


class UsageError(Exception):
    """A bad command-line argument found after parsing; reported by argparse, exit code 2."""


@contextlib.contextmanager
def sigterm_as_ctrl_c():
    """Make SIGTERM (`kill`, a job scheduler) and Windows' Ctrl-Break raise KeyboardInterrupt,
    as Ctrl-C does (and make sure Ctrl-C itself does)."""
    ## Both then unwind through main()'s `except KeyboardInterrupt`, and `finally` blocks on the
    ## way remove half-written temporary files. The caller's handlers are put back afterwards.
    def interrupt(signum, frame):
        raise KeyboardInterrupt

    ## On Windows, Ctrl-Break (or CTRL_BREAK_EVENT, the signal one program can send another
    ## there) arrives as SIGBREAK, which otherwise ends Python without cleaning up.
    if threading.current_thread() is not threading.main_thread():
        ## Only the main thread may set signal handlers; called from another one (a GUI's, a
        ## web app's), Ctrl-C is the host program's to handle.
        yield
        return
    previous = {signal.SIGINT: signal.signal(signal.SIGINT, signal.default_int_handler)}
    previous.update({sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM,
                                                                    *STOP_SIGNALS)})
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    rank = os.environ.get("RANK")  # under torchrun, say which process failed
    where = f" (rank {rank})" if rank else ""
    outputs = run_files.RunOutputs(checkpoint_path(args), args.dry_run)
    try:
        if args.resume:
            run_files.load_training_state(args, parser, argv, outputs)
        with sigterm_as_ctrl_c():
            train(args, outputs)
    except (UsageError, run_files.ResumeError) as err:
        parser.error(str(err))  # exits with code 2, like the other argument errors
    except KeyboardInterrupt:
        if common.is_main_process():
            go_on = run_files.resume_command(args, parser)
            print(f"\ninterrupted: stopped. {outputs.on_disk(go_on, args.epochs)}",
                  file=sys.stderr)
        return 130
    except OSError as err:  # `| head` had read enough, or `> log.txt` filled the disk:
        if (why := common.output_failure(err)) is None:  # training stops, as at Ctrl-C
            raise
        if common.is_main_process():
            go_on = run_files.resume_command(args, parser)
            common.output_closed(f"stopped: {why}. {outputs.on_disk(go_on, args.epochs)}")
        return 1
    except FloatingPointError as err:  # the loss became NaN or inf
        kept = ("The best checkpoint saved so far is unchanged." if outputs.saved else
                "This run saved no checkpoint." if not outputs.checkpoint.exists() else
                f"This run saved nothing: {outputs.checkpoint}, an earlier run's, is unchanged.")
        print(f"error{where}: {err} With this script: --lr {args.lr / 10:g} or --clip-grad 1.0. "
              f"{kept}", file=sys.stderr)
        return 1
    except (common.DataError, common.CheckpointError, common.OutputError) as err:
        print(f"error{where}: {common.sentence(str(err))}", file=sys.stderr)
        return 1
    finally:
        common.cleanup_distributed()
    return 0


if __name__ == "__main__":
    sys.exit(common.flush_output(main()))  # flushed here: `| head` gets no traceback at exit
