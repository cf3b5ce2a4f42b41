"""Rung 1: the classic MNIST script that most tutorials teach. Read it first.

    python mnist_minimal.py      # 5 epochs: about 20 s on a CPU, 4 times mnist_train.py's

It prints the loss every 200 batches, then each epoch's test accuracy: about 0.97 after five
epochs, in a last line such as `Test Accuracy: 0.9753 (9753/10000)`. The best epoch's weights
go to mnist_minimal.pt. mnist_train.py is this program grown: the README's ladder names each step
it adds, and why.
"""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader
from torchvision import datasets, transforms


def load_data(data_dir: str) -> tuple[DataLoader, DataLoader]:
    """MNIST's 60,000 training and 10,000 test pictures, in batches (downloaded if missing)."""
    ## ToTensor: a picture's pixels (0..255) become a 1 x 28 x 28 tensor in 0..1. Normalize:
    ## minus MNIST's mean pixel, divided by their spread, so that inputs are centred on 0.
    transform = transforms.Compose([transforms.ToTensor(),
                                    transforms.Normalize((0.1307,), (0.3081,))])
    train_set = datasets.MNIST(data_dir, train=True, download=True, transform=transform)
    test_set = datasets.MNIST(data_dir, train=False, download=True, transform=transform)
    return (DataLoader(train_set, batch_size=64, shuffle=True),  # shuffle: a new order each epoch
            DataLoader(test_set, batch_size=1000))


class MLP(nn.Module):
    """784 -> 128 -> 64 -> 10: a picture's pixels in, 10 scores out, one per digit."""

    def __init__(self) -> None:
        super().__init__()  # the layers made here hold the weights: model.parameters()
        self.fc1 = nn.Linear(28 * 28, 128)
        self.fc2 = nn.Linear(128, 64)
        self.fc3 = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # model(x) calls this
        x = x.flatten(1)  # [batch, 1, 28, 28] -> [batch, 784]
        x = torch.relu(self.fc1(x))
        x = torch.relu(self.fc2(x))
        return self.fc3(x)  # raw scores ("logits"): CrossEntropyLoss applies the softmax itself


def train(model, loader, criterion, optimizer, device, epoch: int) -> None:
    """One pass over the training pictures, in the five steps of every PyTorch training."""
    model.train()  # layers such as Dropout behave as in training (this MLP has none)
    running_loss = 0.0
    for batch, (images, labels) in enumerate(loader, start=1):
        images, labels = images.to(device), labels.to(device)
        optimizer.zero_grad()  # 1. clear the gradients: backward() adds to them
        outputs = model(images)  # 2. forward
        loss = criterion(outputs, labels)  # 3. the loss: how wrong the scores are
        loss.backward()  # 4. backward: each weight's gradient, d(loss)/d(weight)
        optimizer.step()  # 5. move each weight a little against its gradient
        running_loss += loss.item()
        if batch % 200 == 0:
            print(f"Epoch {epoch} | Batch {batch}/{len(loader)} | Loss {running_loss / 200:.4f}")
            running_loss = 0.0


def test(model, loader, device) -> tuple[int, int]:
    """(correct, total) on the test pictures; nothing is learned here."""
    model.eval()  # layers such as Dropout behave as in evaluation
    correct = 0
    with torch.no_grad():  # no graph for a backward() that never comes: faster, less memory
        for images, labels in loader:
            outputs = model(images.to(device))
            correct += (outputs.argmax(dim=1) == labels.to(device)).sum().item()  # top score
    return correct, len(loader.dataset)


def main() -> None:
    parser = argparse.ArgumentParser(description="The classic MNIST script.")
    parser.add_argument("--epochs", type=int, default=5, help="passes over the training pictures")
    parser.add_argument("--data-dir", default="./data", help="MNIST is in (or goes to) DATA_DIR")
    args = parser.parse_args()
    torch.manual_seed(42)  # the same random weights and the same shuffles every run
    device = torch.accelerator.current_accelerator(check_available=True) or torch.device("cpu")

    train_loader, test_loader = load_data(args.data_dir)  # 1. data
    model = MLP().to(device)  # 2. the model, its weights on the device
    criterion = nn.CrossEntropyLoss()  # 3. the loss
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)  # 4. the optimizer
    best = 0.0
    for epoch in range(1, args.epochs + 1):  # 5. the loop: train, then test
        train(model, train_loader, criterion, optimizer, device, epoch)
        correct, total = test(model, test_loader, device)
        print(f"Test Accuracy: {correct / total:.4f} ({correct}/{total})")
        ## Keep the best epoch's weights (state_dict: each layer's tensors, by name). Chosen on
        ## the test set, whose score then flatters them: mnist_train.py chooses on held-out ones.
        if correct / total > best:
            best = correct / total
            torch.save(model.state_dict(), "mnist_minimal.pt")


if __name__ == "__main__":
    main()
