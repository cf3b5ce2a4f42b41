"""Seconds per epoch of mnist_train.py on a GPU, mlp and cnn: plain, --amp, --compile, --augment.

    python benchmarks/bench_gpu.py --data-dir ../shared/data            # needs a CUDA/MPS/XPU GPU

Runs mnist_train.py once per configuration (3 epochs each, the first includes warm-up and
compilation) and prints a Markdown table of the fastest epoch and the test accuracy, ready for
the README. It also checks, with the PyTorch profiler, that the default in-memory path makes no
host-to-device copy per batch: the whole dataset is copied to the GPU once.
"""

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def run(data_dir: str, model: str, flags: list[str], save_dir: str) -> tuple[float, str]:
    cmd = [sys.executable, "mnist_train.py", "--data-dir", data_dir, "--model", model,
           "--epochs", "3", "--log-interval", "100000", "--save-path",
           f"{save_dir}/{model}{''.join(flags)}.pt", *flags]
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=True).stdout
    seconds = [float(s) for s in re.findall(r"\| ([\d.]+) s", out)]
    accuracy = re.search(r"Test Accuracy: ([\d.]+)", out).group(1)
    return min(seconds), accuracy


def copies_per_epoch(data_dir: str) -> tuple[int, int]:
    """Host-to-device copies during one training epoch of the in-memory path, and its batches."""
    import torch

    sys.path.insert(0, str(REPO))
    import common

    device = common.get_device()
    import mnist_train
    from plumbing import files

    images, labels = files.load_mnist(data_dir, train=True)
    loader = mnist_train.InMemoryLoader(images, labels, 64, mean=common.MNIST_MEAN,
                                        std=common.MNIST_STD, device=device, seed=0)
    model = common.build_model("mlp").to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)
    with torch.profiler.profile() as prof:
        common.train_one_epoch(model, loader, torch.nn.CrossEntropyLoss(), optimizer, device,
                               log=None)
    return sum(e.count for e in prof.key_averages() if "HtoD" in e.key or
               e.key == "aten::_to_copy"), len(loader)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", default="./data")
    args = parser.parse_args()
    copies, batches = copies_per_epoch(args.data_dir)
    print(f"host-to-device copies in one epoch of {batches} batches: {copies}")
    print("| model | flags | fastest epoch | test accuracy |\n|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for model in ("mlp", "cnn"):
            ## --augment last: on a GPU its writing styles draw on every digit, then mask
            ## (augmentation.images_to_draw_on), a path that a CPU never takes.
            for flags in ([], ["--amp"], ["--compile"], ["--amp", "--compile"], ["--augment"]):
                seconds, accuracy = run(args.data_dir, model, flags, tmp)
                print(f"| {model} | {' '.join(flags) or '(none)'} | {seconds:.2f} s | {accuracy} |",
                      flush=True)


if __name__ == "__main__":
    main()
