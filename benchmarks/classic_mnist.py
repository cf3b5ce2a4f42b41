"""The classic MNIST script, written the way most tutorials do.

    python benchmarks/classic_mnist.py --data-dir ../shared/data --epochs 5

It is here only as the baseline for benchmarks/bench_pipeline.py: every sample goes through
PIL -> ToTensor -> Normalize inside a DataLoader, on every epoch. That is the right tool for
data that does not fit in memory or needs per-sample augmentation; for MNIST it spends most of its
time converting images instead of learning. Prints `Test Accuracy: ...` like mnist_train.py.
"""

import argparse
import sys
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader
from torchvision import datasets, transforms

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import common  # only for the model, so that all pipelines train the same network


def classic_loaders(data_dir, batch_size=64, test_batch_size=1000, seed=42):
    transform = transforms.Compose([transforms.ToTensor(),  # PIL image -> float tensor in 0..1
                                    transforms.Normalize((0.1307,), (0.3081,))])
    train_set = datasets.MNIST(data_dir, train=True, download=True, transform=transform)
    test_set = datasets.MNIST(data_dir, train=False, download=True, transform=transform)
    generator = torch.Generator().manual_seed(seed)
    return (DataLoader(train_set, batch_size=batch_size, shuffle=True, generator=generator),
            DataLoader(test_set, batch_size=test_batch_size, shuffle=False))


def classic_train_epoch(model, loader, criterion, optimizer, device, epoch, log=print):
    model.train()
    running = 0.0
    for batch_idx, (data, target) in enumerate(loader):
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        loss = criterion(model(data), target)
        loss.backward()
        optimizer.step()
        running += loss.item()
        if batch_idx % 200 == 199:
            log(f"Epoch {epoch} | Batch {batch_idx + 1}/{len(loader)} | Loss {running / 200:.4f}")
            running = 0.0


def classic_test(model, loader, device):
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for data, target in loader:
            data, target = data.to(device), target.to(device)
            correct += (model(data).argmax(dim=1) == target).sum().item()
            total += target.size(0)
    return correct, total


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data-dir", default="./data")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--model", choices=sorted(common.MODELS), default="mlp")
    parser.add_argument("--device", default=None, help="default: cuda if there is one, else cpu")
    args = parser.parse_args()
    torch.manual_seed(42)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    train_loader, test_loader = classic_loaders(args.data_dir)
    model = common.build_model(args.model).to(device)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for epoch in range(1, args.epochs + 1):
        classic_train_epoch(model, train_loader, criterion, optimizer, device, epoch)
        correct, total = classic_test(model, test_loader, device)
        print(f"Test Accuracy: {correct / total:.4f} ({correct}/{total})")


if __name__ == "__main__":
    main()
