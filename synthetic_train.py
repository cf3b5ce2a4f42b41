"""mnist_train.py's training loop on generated data: no download, small enough for any CPU.

    python synthetic_train.py                 # 10 epochs
    python synthetic_train.py --epochs 20 --lr 3e-3

What you should see: the learning rate climbs in epoch 1 (warmup) and then decays along a cosine;
the loss falls, and validation accuracy climbs from chance (25%), mostly in epoch 1, towards 90%:

    8000 train / 2000 val samples, 4 classes (chance accuracy 0.25), device cpu
    epoch  1/10 | lr 0.001000 | train loss 1.2259 | val loss 0.8939 | val acc 0.7305
    ...
    epoch 10/10 | lr 0.000000 | train loss 0.2232 | val loss 0.2394 | val acc 0.9130

If this runs but your own training fails, suspect your data, model or settings, not PyTorch or the
loop (common.py's). New here: a Dataset subclass, Xavier initialisation, warmup + cosine by hand,
and gradient clipping: gradients whose joint size passes --clip-grad shrink to it, against spikes.
"""

import math
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

import common
from plumbing import runs
from plumbing.runs import ArgumentParser, number_from, positive


# 1. data ------------------------------------------------------------------------------------
class ClusterDataset(Dataset):
    """Noisy points around two centres per class: no straight line separates the classes, so
    the hidden layer has work to do, and they overlap a little, so accuracy stays below 100%."""

    ## A Dataset says how many samples it has (__len__) and what sample i is (__getitem__);
    ## DataLoader does the rest: shuffling, batching, worker processes.
    def __init__(self, size: int, input_dim: int, num_classes: int, seed: int) -> None:
        centres = torch.randn(2 * num_classes, input_dim,  # one problem for every split and seed
                              generator=torch.Generator().manual_seed(1234)) * 0.45
        g = torch.Generator().manual_seed(seed)  # its own points for each split
        which = torch.randint(len(centres), (size,), generator=g)
        self.labels = which % num_classes  # integer labels 0..num_classes-1, as the loss expects
        self.samples = centres[which] + torch.randn(size, input_dim, generator=g) * 0.6

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.samples[idx], self.labels[idx]


# 2. model -----------------------------------------------------------------------------------
class SimpleClassifier(nn.Module):
    """One hidden layer: input_dim -> hidden_dim -> ReLU -> num_classes logits."""

    def __init__(self, input_dim: int, hidden_dim: int, num_classes: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(input_dim, hidden_dim)
        self.relu = nn.ReLU()
        self.fc2 = nn.Linear(hidden_dim, num_classes)
        self.apply(init_weights)  # runs init_weights (below) on every submodule

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.relu(self.fc1(x)))


def init_weights(module: nn.Module) -> None:
    """Xavier-uniform weights and zero biases for every nn.Linear."""
    ## Xavier (Glorot) scales random weights by the layer's fan-in and fan-out (inputs, outputs)
    ## so that activations and gradients keep their size from layer to layer. Kaiming (He,
    ## nn.init.kaiming_uniform_) is the usual pick for ReLU, and nn.Linear's default would do:
    ## Xavier shows the choice in code. torch.empty() weights need one: they hold leftover memory.
    if isinstance(module, nn.Linear):
        nn.init.xavier_uniform_(module.weight)
        nn.init.zeros_(module.bias)


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.split("\n")[0])
    add = parser.add_argument
    add("--epochs", type=positive(int), default=10, help="passes over the data")
    add("--batch-size", type=positive(int), default=64, help="samples per training step")
    add("--lr", type=positive(float), default=1e-3, help="peak learning rate, after warmup")
    add("--warmup-epochs", type=float, default=1.0, help="epochs in which the rate climbs to --lr")
    add("--clip-grad", type=positive(float), default=1.0, help="max gradient norm")
    ## At least 4 samples, as a quarter as many again are drawn for validation (below).
    add("--samples", type=number_from(4, 2**31 - 1), default=8000, help="training samples")
    add("--input-dim", type=positive(int), default=20, help="numbers per sample")
    add("--hidden-dim", type=positive(int), default=64, help="units of the hidden layer")
    add("--num-classes", type=number_from(2, 2**31 - 1), default=4, help="classes to tell apart")
    ## 0: batches are made in this process: rows of a tensor in memory need no worker processes.
    add("--num-workers", type=number_from(0, 64), default=0, help="DataLoader worker processes")
    add("--device", default="auto", help="auto, cpu, cuda, mps, xpu")
    add("--seed", type=number_from(0, 2**32 - 1), default=0, help="same seed, same run")
    args = parser.parse_args(argv)
    if not 0 <= args.warmup_epochs <= args.epochs:
        parser.error(f"--warmup-epochs must be from 0 to --epochs ({args.epochs})")
    if args.warmup_epochs == args.epochs:
        print(f"note: the warmup takes all {args.epochs} epochs, so the learning rate only climbs "
              "and never decays: give more --epochs than --warmup-epochs for the cosine part")
    try:
        device = common.get_device(args.device)
    except ValueError as err:
        parser.error(str(err))
    generator = common.set_seed(args.seed)

    train_set = ClusterDataset(args.samples, args.input_dim, args.num_classes, args.seed + 1)
    val_set = ClusterDataset(args.samples // 4, args.input_dim, args.num_classes, args.seed + 2)
    ## Shuffle the training data only (a new order each epoch: the model cannot learn the order).
    ## pin_memory: batches in page-locked memory, which a GPU copies from faster.
    train_loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True,
                              generator=generator, num_workers=args.num_workers,  # by --seed
                              pin_memory=device.type == "cuda")
    ## Evaluation keeps no gradients, so bigger batches fit; the size does not change the result.
    val_loader = DataLoader(val_set, batch_size=256, num_workers=args.num_workers)

    model = SimpleClassifier(args.input_dim, args.hidden_dim, args.num_classes).to(device)

    # 3. loss and 4. optimizer -------------------------------------------------------------------
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    ## Warmup + cosine, stepped per batch. Early on, with random weights and Adam's averages still
    ## poor, full steps can throw the model somewhere bad: the rate ramps up linearly. The cosine
    ## then shrinks the steps to zero, so the model settles. (mnist_train.py uses SequentialLR.)
    total_steps = args.epochs * len(train_loader)
    warmup_steps = max(1, round(args.warmup_epochs * len(train_loader)))

    def warmup_cosine(step: int) -> float:  # multiplies the base learning rate
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine)

    # 5. training loop ---------------------------------------------------------------------------
    print(f"{len(train_set)} train / {len(val_set)} val samples, {args.num_classes} classes "
          f"(chance accuracy {1 / args.num_classes:.2f}), device {device}")
    for epoch in range(1, args.epochs + 1):
        try:
            train_loss = common.train_one_epoch(model, train_loader, criterion, optimizer, device,
                                                epoch=epoch, clip_grad=args.clip_grad,
                                                scheduler=scheduler, log=None)
        except FloatingPointError as err:  # the loss became NaN or inf: one line, exit code 1
            print(f"error: {err} With this script: a lower --lr, or a smaller --clip-grad.",
                  file=sys.stderr)
            return 1
        val_loss, val_acc = common.evaluate(model, val_loader, criterion, device)
        lr = optimizer.param_groups[0]["lr"]  # after this epoch's last step: 0 at the very end
        print(f"epoch {epoch:2d}/{args.epochs} | lr {lr:.6f} | train loss {train_loss:.4f} | "
              f"val loss {val_loss:.4f} | val acc {val_acc:.4f}")
    return 0


if __name__ == "__main__":
    runs.run_script(main)
