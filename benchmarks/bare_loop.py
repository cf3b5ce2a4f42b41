"""The least time a training run of mnist_train.py's shape can take: only the training steps.

    python benchmarks/bare_loop.py --epochs 5

benchmarks/bench_pipeline.py --end-to-end runs it beside mnist_minimal.py and mnist_train.py.
It pays what mnist_train.py pays before and around its training, and nothing else: starting
Python, `import torch`, the same gc.freeze() after the imports, building the same model and the
same fused Adam (whose first use imports torch._dynamo, PyTorch's compiler), and 860 steps of
64 samples per epoch. Its data are random tensors already in memory: no files are read, and
nothing is evaluated, saved or printed. So mnist_train.py's time minus this one is what its
own work costs (its other imports, reading MNIST, validation, checkpoints, the final test and
its pictures), and mnist_minimal.py's time divided by this one is the largest speed-up any
script could show.
"""

import argparse
import gc
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import common


def floor_epoch(model, inputs, targets, criterion, optimizer, batch_size):
    """One epoch of training steps on tensors in memory, sliced in order: no data pipeline."""
    model.train()
    for start in range(0, len(targets), batch_size):
        optimizer.zero_grad(set_to_none=True)
        criterion(model(inputs[start : start + batch_size]),
                  targets[start : start + batch_size]).backward()
        optimizer.step()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--model", choices=sorted(common.MODELS), default="mlp")
    parser.add_argument("--device", default="auto")
    args = parser.parse_args()
    torch.set_flush_denormal(True)  # as mnist_train.py's setup() does, before any maths
    try:
        device = common.get_device(args.device)
    except ValueError as err:
        parser.error(str(err))
    torch.manual_seed(42)
    model = common.build_model(args.model).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)
    criterion = nn.CrossEntropyLoss()
    inputs = torch.randn(55_000, 1, 28, 28, device=device)
    targets = torch.randint(0, 10, (55_000,), device=device)
    for _ in range(args.epochs):
        floor_epoch(model, inputs, targets, criterion, optimizer, 64)  # 860 batches
    if device.type != "cpu":
        torch.accelerator.synchronize()  # the GPU's queue of work is part of the run


if __name__ == "__main__":
    gc.freeze()  # as mnist_train.py does: the floor pays what the script pays, no more
    main()
