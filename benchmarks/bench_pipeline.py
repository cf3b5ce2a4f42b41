"""Time three ways of feeding the same model, side by side in one run.

    python benchmarks/bench_pipeline.py --data-dir ../shared/data               # MLP, 5 epochs
    python benchmarks/bench_pipeline.py --data-dir ../shared/data --model cnn
    python benchmarks/bench_pipeline.py --data-dir ../shared/data --end-to-end  # whole scripts
    python benchmarks/bench_pipeline.py --data-dir ../shared/data --chunk 50    # (b) (c) (d) only

All train the same model with Adam (lr 1e-3), batch 64 and seed 42 on 60,000 training
images, and their epochs are interleaved (a1 b1 c1 d1 a2 b2 ...) so that a slow moment of a
shared machine hits all of them alike:
  (a) classic    mnist_minimal.py's loaders and loop: PIL -> ToTensor -> Normalize per sample
                 in a DataLoader, plain Adam
  (b) this repo  images decoded and normalised once (mnist_train.InMemoryLoader), batches indexed
                 from memory, common.train_one_epoch, fused Adam
  (c) floor      the same model and optimizer as (b) on random tensors already in memory, sliced
                 in order: what training costs with no data pipeline at all
  (d) floor on MNIST: the same as (c) on (b)'s normalised MNIST images, sliced in order.
                 Training on real images makes denormal numbers, slow on some CPUs
                 (docs/speed.md); flushed, as here, (d) costs what (c) does. (b)/(d) is the
                 pipeline's own cost
Each pipeline's time is the median of its epochs after the first (which includes warm-up), and
each ratio is the median of the per-epoch ratios: a median, so that one quiet or one busy
moment on a noisy machine does not decide the figure. On a machine whose speed swings from
second to second, --chunk 50 alternates (b), (c) and (d) every 50 steps instead, and compares
those rounds: far less noisy than whole epochs.

--end-to-end instead runs mnist_minimal.py, mnist_train.py and benchmarks/bare_loop.py (--epochs
each, 5 by default; the MLP, on the device each picks by itself) as separate processes, round
after round (classic, ours, bare loop, classic, ...; --rounds sets how many), and reports the
median wall time from process start to exit, the peak memory and the test accuracy. The bare
loop has `import torch`, mnist_train.py's model, optimizer and training steps, on random tensors,
with no files, evaluation or saving: no script of this shape can be faster, so mnist_minimal.py's
time over bare_loop.py's is the largest speed-up this machine allows.
"""

import argparse
import contextlib
import io
import itertools
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import torch
from torch import nn

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from bare_loop import floor_epoch

import common
import mnist_minimal
import mnist_train
from plumbing import files, runs


def timed(device, fn, *args, **kwargs):
    start = time.perf_counter()
    fn(*args, **kwargs)
    if device.type != "cpu":
        torch.accelerator.synchronize()  # GPU work is asynchronous: wait for it before timing
    return time.perf_counter() - start


def per_epoch(args, device):
    criterion = nn.CrossEntropyLoss()
    images, labels = files.load_mnist(args.data_dir, train=True)
    test_images, test_labels = files.load_mnist(args.data_dir, train=False)

    torch.manual_seed(42)
    model_a = common.build_model(args.model).to(device)
    opt_a = torch.optim.Adam(model_a.parameters(), lr=1e-3)
    train_a, test_a = mnist_minimal.load_data(args.data_dir)

    torch.manual_seed(42)
    model_b = common.build_model(args.model).to(device)
    opt_b = torch.optim.Adam(model_b.parameters(), lr=1e-3, fused=True)
    mean, std = common.MNIST_MEAN, common.MNIST_STD
    loader = partial(mnist_train.InMemoryLoader, mean=mean, std=std, device=device)
    train_b, test_b = loader(images, labels, 64, seed=42), loader(test_images, test_labels, 1000)

    torch.manual_seed(42)
    model_c = common.build_model(args.model).to(device)
    opt_c = torch.optim.Adam(model_c.parameters(), lr=1e-3, fused=True)
    x_c = torch.randn(len(labels), 1, 28, 28, device=device)
    y_c = torch.randint(0, 10, (len(labels),), device=device)

    torch.manual_seed(42)
    model_d = common.build_model(args.model).to(device)
    opt_d = torch.optim.Adam(model_d.parameters(), lr=1e-3, fused=True)

    if args.chunk:
        return per_chunk(args, device, criterion, (model_b, opt_b, train_b),
                         (model_c, opt_c, x_c, y_c), (model_d, opt_d))
    times = {"a": [], "b": [], "c": [], "d": []}
    for epoch in range(1, args.epochs + 1):
        with contextlib.redirect_stdout(io.StringIO()):  # its loss lines
            times["a"].append(timed(device, mnist_minimal.train, model_a, train_a, criterion,
                                    opt_a, device, epoch))
        train_b.epoch = epoch  # as mnist_train.py does: a new order each epoch
        times["b"].append(timed(device, common.train_one_epoch, model_b, train_b, criterion,
                                opt_b, device, epoch=epoch, log=None))
        times["c"].append(timed(device, floor_epoch, model_c, x_c, y_c, criterion, opt_c, 64))
        times["d"].append(timed(device, floor_epoch, model_d, train_b.inputs, train_b.targets,
                                criterion, opt_d, 64))
        print(f"epoch {epoch}: " + "  ".join(f"({k}) {v[-1]:.2f} s" for k, v in times.items()),
              flush=True)
    correct, total = mnist_minimal.test(model_a, test_a, device)
    acc_b = common.evaluate(model_b, test_b, criterion, device)[1]
    later = {k: v[1:] if len(v) > 1 else v for k, v in times.items()}  # epoch 1 warms up
    typical = {k: statistics.median(v) for k, v in later.items()}
    print(f"\n{args.model} on {device}, {args.epochs} epochs of 60,000 images, batch 64 "
          f"(torch {torch.__version__}, {torch.get_num_threads()} CPU threads)")
    print("| pipeline | " + " | ".join(f"epoch {i}" for i in range(1, args.epochs + 1))
          + " | median of epochs 2+ | test accuracy |")
    print("|---" * (args.epochs + 3) + "|")
    names = {"a": "(a) classic DataLoader", "b": "(b) this repo", "c": "(c) compute floor",
             "d": "(d) floor on MNIST"}
    accs = {"a": f"{correct / total:.4f}", "b": f"{acc_b:.4f}", "c": "-", "d": "-"}
    for k in "abcd":
        print(f"| {names[k]} | " + " | ".join(f"{t:.2f} s" for t in times[k])
              + f" | {typical[k]:.2f} s | {accs[k]} |")
    ## The ratio of the two epochs that ran side by side, epoch by epoch, then the median.
    a_b = statistics.median(a / b for a, b in zip(later["a"], later["b"]))
    b_c = statistics.median(b / c for b, c in zip(later["b"], later["c"]))
    b_d = statistics.median(b / d for b, d in zip(later["b"], later["d"]))
    print(f"\n(a)/(b) = {a_b:.1f}x faster;  (b)/(c) = {b_c:.2f}x the compute floor;  (b)/(d) = "
          f"{b_d:.2f}x the floor on MNIST (medians of the per-epoch ratios, epochs 2+)")


def per_chunk(args, device, criterion, b, c, d):
    """(b), (c) and (d) alternated every --chunk steps, not every epoch: a busy spell of a
    shared machine, which can last seconds, then hits all three far more evenly."""
    (model_b, opt_b, train_b), (model_c, opt_c, x_c, y_c), (model_d, opt_d) = b, c, d
    steps = args.epochs * len(train_b)
    batches = itertools.chain.from_iterable(itertools.repeat(train_b))  # epoch after epoch
    n, k = len(y_c), args.chunk
    span = k * 64  # the images of one turn of k batches
    if span > n:
        sys.exit(f"--chunk {k}: {k} batches of 64 are more than the {n} images: give fewer")
    inputs, targets = train_b.inputs, train_b.targets  # (b)'s normalised MNIST images, for (d)
    times = {"b": [], "c": [], "d": []}
    for first in range(0, steps - k + 1, k):
        start = first * 64 % (n // span * span)  # (c), (d): the next k batches, in order
        times["b"].append(timed(device, common.train_one_epoch, model_b,
                                itertools.islice(batches, k), criterion, opt_b, device, log=None))
        times["c"].append(timed(device, floor_epoch, model_c, x_c[start : start + span],
                                y_c[start : start + span], criterion, opt_c, 64))
        times["d"].append(timed(device, floor_epoch, model_d, inputs[start : start + span],
                                targets[start : start + span], criterion, opt_d, 64))
    skip = math.ceil(len(train_b) / k)  # an epoch's worth warms up (units die: see README)
    if len(times["b"]) <= skip:
        sys.exit(f"--chunk {k}: no rounds left after the warm-up: give more --epochs or a "
                 "smaller --chunk")
    later = {key: v[skip:] for key, v in times.items()}
    ratio = {pair: statistics.median(x / y for x, y in zip(later[pair[0]], later[pair[1]]))
             for pair in ("bc", "bd", "dc")}
    print(f"{args.model} on {device}, {len(later['b'])} rounds of {k} steps (batch 64) after "
          f"{skip} of warm-up, alternated (torch {torch.__version__}, "
          f"{torch.get_num_threads()} CPU threads)")
    print(f"(b)/(c) = {ratio['bc']:.3f}x the compute floor;  (b)/(d) = {ratio['bd']:.3f}x the "
          f"floor on MNIST;  (d)/(c) = {ratio['dc']:.3f}x (medians of the rounds' ratios)")


def run_script(cmd, cwd):
    """Run a command in `cwd`; return (wall seconds, peak RSS in MiB or None, its last 'Test
    Accuracy' line, or '-' for a script that prints none)."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, text=True)
    out = proc.stdout.read()
    if hasattr(os, "wait4"):  # Linux and macOS: the resource usage of this child alone
        _, status, usage = os.wait4(proc.pid, 0)
        code = os.waitstatus_to_exitcode(status)
        ## ru_maxrss is in kilobytes on Linux but in bytes on macOS (see `man getrusage`).
        peak = usage.ru_maxrss / (1024 * 1024 if sys.platform == "darwin" else 1024)
    else:  # Windows has no wait4: no peak memory
        code, peak = proc.wait(), None
    seconds = time.perf_counter() - start
    if code != 0:
        sys.exit(f"{' '.join(cmd)} failed")
    accuracy = [ln for ln in out.splitlines() if ln.startswith("Test Accuracy")] or ["-"]
    return seconds, peak, accuracy[-1]


def end_to_end(args, device: torch.device):
    ## The scripts run in a temporary folder (mnist_minimal.py saves into checkpoints/ there),
    ## so a relative --data-dir is made absolute here.
    data_dir, epochs = str(Path(args.data_dir).resolve()), str(args.epochs)
    runs = {
        "mnist_minimal.py": [sys.executable, str(REPO / "mnist_minimal.py"), "--data-dir",
                             data_dir, "--epochs", epochs],
        "mnist_train.py": [sys.executable, str(REPO / "mnist_train.py"), "--data-dir", data_dir,
                           "--epochs", epochs, "--save-path", "bench.pt"],
        "bare_loop.py": [sys.executable, str(REPO / "benchmarks" / "bare_loop.py"), "--epochs",
                         epochs],
    }
    with tempfile.TemporaryDirectory() as tmp:
        results = {name: [] for name in runs}
        for round_ in range(1, args.rounds + 1):  # alternated: a busy spell hits all alike
            for name, cmd in runs.items():
                results[name].append(run_script(cmd, tmp))
                seconds, peak, accuracy = results[name][-1]
                memory = f"peak {peak:.0f} MiB" if peak is not None else "peak memory unknown"
                print(f"round {round_}: {name}: {seconds:.1f} s, {memory}, {accuracy}", flush=True)
    classic, ours, bare = (statistics.median(r[0] for r in results[name]) for name in runs)
    ratios = [c[0] / o[0] for c, o, _ in zip(*results.values())]
    ceilings = [c[0] / b[0] for c, _, b in zip(*results.values())]
    print(f"\nmedians of {args.rounds}: mnist_minimal.py {classic:.1f} s, mnist_train.py "
          f"{ours:.1f} s, bare_loop.py {bare:.1f} s; mnist_train.py is "
          f"{statistics.median(ratios):.1f}x faster end to end (median of the rounds' ratios; "
          f"each round: {', '.join(f'{r:.1f}x' for r in ratios)}); the bare loop, the fastest "
          f"any script of this shape can be, {statistics.median(ceilings):.1f}x "
          f"({', '.join(f'{r:.1f}x' for r in ceilings)})")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", default="./data")
    parser.add_argument("--model", choices=sorted(common.MODELS), default="mlp")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--epochs", type=runs.positive(int), default=5,
                        help="epochs of each pipeline (or script, with --end-to-end); the median "
                             "of the epoch-by-epoch ratios (from epoch 2 on) is compared")
    parser.add_argument("--chunk", type=runs.positive(int), default=None, metavar="STEPS",
                        help="time (b), (c) and (d) only, alternated every STEPS training steps "
                             "instead of every epoch, for --epochs epochs' worth of steps; the "
                             "first epoch's worth is warm-up")
    parser.add_argument("--end-to-end", action="store_true")
    parser.add_argument("--rounds", type=runs.positive(int), default=3,
                        help="--end-to-end: how many alternated rounds of runs (classic, "
                             "ours, the bare loop)")
    args = parser.parse_args()
    ## The pipelines timed in this process train as mnist_train.py does: with denormals flushed
    ## to zero (see its setup()), set before any tensor maths so that torch's worker threads
    ## inherit it. (--end-to-end runs each script as it is: mnist_minimal.py does not.)
    torch.set_flush_denormal(True)
    try:
        device = common.get_device(args.device)
    except ValueError as err:
        parser.error(str(err))
    if args.chunk and args.end_to_end:
        parser.error("--chunk alternates steps within one process: leave out --end-to-end")
    if args.end_to_end and (args.model != "mlp" or args.device != "auto"):
        parser.error("--end-to-end runs mnist_minimal.py, which trains the MLP on the device it "
                     "picks itself: leave out --model and --device")
    if args.epochs < 2 and not args.end_to_end:
        parser.error("--epochs must be at least 2: the first epoch (warm-up) is not compared")
    if args.end_to_end:
        end_to_end(args, device)
    else:
        per_epoch(args, device)


if __name__ == "__main__":
    main()
