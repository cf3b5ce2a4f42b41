"""mnist_train.py's training loop on generated data: no download, small enough for any CPU.

    python synthetic_train.py                 # 10 epochs
    python synthetic_train.py --epochs 20 --lr 3e-3

What you should see: the learning rate climbs during the first epoch (warmup: each line shows
the rate after its epoch's last step, so the climb itself is inside epoch 1) and then decays
along a cosine, the loss falls, and validation accuracy climbs from chance (25%, before any
training; most of that climb is inside epoch 1 too) towards 90%:

    8000 train / 2000 val samples, 4 classes (chance accuracy 0.25), device cpu
    epoch  1/10 | lr 0.001000 | train loss 1.2259 | val loss 0.8939 | val acc 0.7305
    ...
    epoch 10/10 | lr 0.000000 | train loss 0.2232 | val loss 0.2394 | val acc 0.9130

Start here when something is wrong with your own training: if this runs, your PyTorch install
and the loop work, and the problem is in your data, your model or its settings (learning
rate, batch size). It reuses common.py's train_one_epoch (zero_grad -> forward -> loss ->
backward -> clip -> step) and evaluate, and adds what the MNIST script does not show: a
Dataset subclass and choosing an initialisation (Xavier). It also writes out by hand the
learning-rate warmup and cosine decay that mnist_train.py's --schedule warmup-cosine builds
from PyTorch's schedulers. Gradient clipping (shrinking the gradients when their joint size
exceeds a limit, against sudden spikes), optional in the MNIST script, is always on here:
--clip-grad sets the limit.
"""

import math
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

import common
import safeguards


# 1. data ------------------------------------------------------------------------------------
class ClusterDataset(Dataset):
    """Points scattered around class centres: a learnable problem that is not too easy."""

    ## A Dataset answers two questions: how many samples (__len__) and what sample i is
    ## (__getitem__). DataLoader does the rest: shuffling, batching, worker processes.
    ## Each class owns two centres, so the hidden layer has work to do: a linear model without
    ## it reached 81% where this one reaches 93% (20 epochs each). Points get Gaussian noise, so
    ## the classes overlap a little and accuracy tops out below 100%, like real data. The
    ## centres are the same for every --seed: the seed changes the points, not the problem.

    def __init__(self, size: int, input_dim: int, num_classes: int, seed: int) -> None:
        centres = torch.randn(2 * num_classes, input_dim,  # same centres for every split
                              generator=torch.Generator().manual_seed(1234)) * 0.45
        g = torch.Generator().manual_seed(seed)  # different points for each split
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
    ## Xavier (Glorot) initialisation scales random weights by the layer's fan-in and fan-out
    ## (its numbers of inputs and outputs) so that activations and gradients keep roughly the
    ## same size from layer to layer. Kaiming (He) initialisation, nn.init.kaiming_uniform_, is
    ## the textbook pick for ReLU layers, and nn.Linear's own default (a scaled-down Kaiming)
    ## would also do for a net this small: Xavier is here to show how the choice is made in
    ## code, not because it is better for this net. You choose one yourself when signals
    ## shrink or explode through many layers, and you must for weights you create yourself with
    ## nn.Parameter(torch.empty(...)), which start as whatever was in memory.
    if isinstance(module, nn.Linear):
        nn.init.xavier_uniform_(module.weight)
        nn.init.zeros_(module.bias)


def main(argv: list[str] | None = None) -> int:
    parser = safeguards.ArgumentParser(description=__doc__.split("\n")[0])
    positive, add = safeguards.positive, parser.add_argument
    add("--epochs", type=positive(int), default=10, help="passes over the data")
    add("--batch-size", type=positive(int), default=64, help="samples per training step")
    add("--lr", type=positive(float), default=1e-3, help="peak learning rate, after warmup")
    add("--warmup-epochs", type=float, default=1.0,
        help="epochs over which the learning rate climbs to --lr")
    add("--clip-grad", type=positive(float), default=1.0, help="max gradient norm")
    add("--samples", type=positive(int), default=8000, help="training samples")
    add("--input-dim", type=positive(int), default=20, help="numbers per sample")
    add("--hidden-dim", type=positive(int), default=64, help="units of the hidden layer")
    add("--num-classes", type=int, default=4, help="classes to tell apart")
    ## 0: batches are made in this process. A sample here is one row of a tensor already in
    ## memory, far cheaper than starting and feeding worker processes.
    add("--num-workers", type=safeguards.number_from(0, 64), default=0,
        help="DataLoader worker processes")
    add("--device", default="auto", help="auto, cpu, cuda, mps, xpu")
    add("--seed", type=safeguards.number_from(0, 2**32 - 1), default=0,
        help="same seed, same run")
    args = parser.parse_args(argv)
    if args.samples < 4:  # a quarter of --samples is the validation set
        parser.error("--samples must be at least 4")
    if not 0 <= args.warmup_epochs <= args.epochs:
        parser.error(f"--warmup-epochs must be from 0 to --epochs ({args.epochs})")
    if args.warmup_epochs == args.epochs:
        print(f"note: the warmup takes all {args.epochs} epochs, so the learning rate only climbs "
              "and never decays: give more --epochs than --warmup-epochs for the cosine part")
    if args.num_classes < 2:
        parser.error("--num-classes must be at least 2")
    try:
        device = common.get_device(args.device)
    except ValueError as err:
        parser.error(str(err))
    generator = common.set_seed(args.seed)

    train_set = ClusterDataset(args.samples, args.input_dim, args.num_classes, seed=args.seed + 1)
    val_set = ClusterDataset(args.samples // 4, args.input_dim, args.num_classes,
                             seed=args.seed + 2)
    ## Shuffle the training data only: a new order each epoch stops the model from learning the
    ## order; validation order does not matter, and a fixed one makes runs easier to compare.
    ## generator (from common.set_seed): the shuffled order depends on --seed alone.
    train_loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True,
                              generator=generator, num_workers=args.num_workers)
    ## Evaluation keeps no gradients, so bigger batches fit; the size does not change the result.
    val_loader = DataLoader(val_set, batch_size=256, num_workers=args.num_workers)

    model = SimpleClassifier(args.input_dim, args.hidden_dim, args.num_classes).to(device)

    # 3. loss and 4. optimizer -------------------------------------------------------------------
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    ## Warmup + cosine, stepped once per batch. Early on, Adam's running averages of each
    ## gradient and of its square, which size its steps, are poor estimates, and the weights are
    ## random, so full-size steps can throw the model somewhere bad: the warmup ramps the rate
    ## up linearly. Cosine decay then shrinks steps smoothly to zero so that the model settles
    ## into a minimum. (Built-in equivalent: SequentialLR of LinearLR and CosineAnnealingLR.)
    total_steps = args.epochs * len(train_loader)
    warmup_steps = max(1, round(args.warmup_epochs * len(train_loader)))

    def warmup_cosine(step: int) -> float:  # multiplies the base learning rate
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine)

    # 5. training loop ---------------------------------------------------------------------------
    chance = 1 / args.num_classes
    print(f"{len(train_set)} train / {len(val_set)} val samples, {args.num_classes} classes "
          f"(chance accuracy {chance:.2f}), device {device}")
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
    safeguards.run_script(main)
