"""How the scripts run: their command lines, the machine they run on (its devices, torchrun,
its memory), and how a training run starts and ends: the checks before any work, the hold on
its save path, an earlier run's files set aside, and, whatever stops the run, one line that
says what is on disk and how to go on. run_script() ends the other scripts the same way."""

import argparse
import contextlib
import difflib
import errno
import gc
import glob
import importlib.util
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch
from PIL import Image

import common
from plumbing import files
from plumbing.files import RunFiles


# command lines -------------------------------------------------------------------------------
class UsageError(Exception):
    """A command line that cannot work, found after parsing: reported as argparse's errors are."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser: real defaults in --help, no silent abbreviations, "did you mean ...?"."""

    def __init__(self, **kwargs) -> None:
        super().__init__(formatter_class=HelpFormatter, allow_abbrev=False, **kwargs)

    def error(self, message: str):
        ## The unrecognized words up to "--" (after it, none is a flag)
        words = message.split()[2:] if message.startswith("unrecognized arguments") else []
        flags = [o for action in self._actions for o in action.option_strings]
        for typed in [w.split("=")[0] for w in words[: (words + ["--"]).index("--")]]:
            if typed.startswith("--") and (meant := [f for f in flags if f.startswith(typed)]
                                           or difflib.get_close_matches(typed, flags, 1, 0.8)):
                super().error(f"{message} (did you mean {' or '.join(meant)}?)")  # exits
        super().error(message)


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    def _get_help_string(self, action: argparse.Action) -> str | None:  # no "(default: None)"
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


def positive(kind: type) -> Callable[[str], int | float]:
    """argparse type: a positive, finite int or float, within PyTorch's sizes and float32."""
    limit, shown = (2**31 - 1, "2147483647") if kind is int else (1e30, "1e30")  # float32: 3e38

    def parse(text: str):
        with contextlib.suppress(ValueError):
            if 0 < (value := kind(text)) <= limit:  # nan and inf fail too
                return value
        raise argparse.ArgumentTypeError(f"expected a{' whole' * (kind is int)} number above 0 "
                                         f"and at most {shown}, got {text!r}")
    return parse


def number_from(low: int, high: int) -> Callable[[str], int]:
    """argparse type: a whole number from `low` to `high`."""
    def parse(text: str) -> int:
        if not (text.isascii() and text.isdigit() and low <= int(text) <= high):
            raise argparse.ArgumentTypeError(f"expected a whole number from {low} to {high}, "
                                             f"got {text!r}")
        return int(text)
    return parse


def file_path(text: str) -> Path:
    """argparse type: a file's path, not a folder's, as typed (Path drops the / of "dir/")."""
    if text.endswith(("/", os.sep)) or Path(text).name in ("", ".", ".."):
        raise argparse.ArgumentTypeError(f"{text!r} names a folder, not a file: give a file's "
                                         "name, such as checkpoints/model.pt")
    return Path(text)


def as_words(args: argparse.Namespace, names: tuple[str, ...]) -> list[str]:
    """Settings as command-line words: ['--lr', '0.001', '--augment', '--hidden', '128', '64']."""
    words = []
    for name in names:
        value = getattr(args, name)
        if value is not None and value is not False:
            words += [f"--{name.replace('_', '-')}", *map(str, value if isinstance(value, list)
                                                           else [] if value is True else [value])]
    return words


# the machine: torchrun, GPUs, compilers, memory ----------------------------------------------
def join_torchrun(device: torch.device) -> tuple[int, torch.device]:
    """Join the other processes that torchrun started; return (this one's rank, its device):
    (0, device) in a plain run."""
    if "RANK" not in os.environ:  # torchrun sets it in every process it starts
        return 0, device
    if device.type == "mps":
        raise UsageError("torchrun cannot use Apple's GPU (mps), as gloo takes CPU tensors only: "
                         "add --device cpu, or run without torchrun to use the GPU")
    if device.type == "cuda":  # one GPU per process: local rank k uses GPU k
        local_rank, count = int(os.environ.get("LOCAL_RANK", 0)), torch.cuda.device_count()
        if local_rank >= count:
            raise UsageError(f"local rank {local_rank} has no GPU: this machine has {count} "
                             f"GPU(s); give torchrun --nproc_per_node={count}, or --device cpu")
        torch.cuda.set_device(device := torch.device("cuda", local_rank))
    if sys.platform == "win32":  # PyTorch there lacks libuv, which gloo wants (docs/distributed.md)
        os.environ.setdefault("USE_LIBUV", "0")
    ## Imported before the group exists: its functions take the group as a default argument.
    ## Imported later (the optimizer does), they keep it alive, and its threads abort the exit.
    import torch.distributed.nn as _  # noqa: F401

    dist = torch.distributed
    ## NCCL moves tensors from GPU to GPU (Windows has no NCCL); gloo works on CPU tensors.
    nccl = device.type == "cuda" and sys.platform != "win32"
    ## device_id: this rank's GPU, told once here, or each collective guesses it (and warns).
    dist.init_process_group("nccl" if nccl else "gloo", device_id=device if nccl else None)
    return dist.get_rank(), device


def distributed() -> bool:
    """Whether torchrun started this process among others, and join_torchrun() joined them."""
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def world_and_rank() -> tuple[int, int]:
    """How many processes train together, and this one's number (its rank): (1, 0) without
    torchrun."""
    dist = torch.distributed
    return (dist.get_world_size(), dist.get_rank()) if distributed() else (1, 0)


def mean_over_processes(value: float, device: torch.device) -> float:
    """The mean of `value` over torchrun's processes (they all call this together); in a plain
    run, `value` itself."""
    if not distributed():
        return value
    total = torch.tensor(value, dtype=torch.float64, device=device)  # NCCL: on the GPU
    torch.distributed.all_reduce(total)  # every process's value, added up
    return total.item() / torch.distributed.get_world_size()


def is_main_process() -> bool:
    """True in a plain run and on rank 0, also before the processes have joined."""
    return os.environ.get("RANK", "0") == "0"


def leave_distributed(wait: bool) -> None:
    """Leave torchrun's process group; after the others (`wait`) when the run went well."""
    if distributed():
        if wait:  # a rank that leaves while another still works can bring the whole run down
            torch.distributed.barrier()
        torch.distributed.destroy_process_group()


def amp_dtype(choice: str | None, device: torch.device) -> torch.dtype | None:
    """--amp as a dtype: bfloat16, which keeps float32's range and needs no GradScaler, where
    the device computes it natively; float16 on older NVIDIA GPUs."""
    if choice == "auto" and device.type == "cuda":  # NVIDIA: native from Ampere (8.0) on; AMD: 9+
        ## Not torch.cuda.is_bf16_supported(): it says True where bfloat16 is only emulated
        ## (T4, V100, RTX 20xx: slower than float32), and about the current GPU, not `device`.
        choice = "bf16" if torch.cuda.get_device_capability(device) >= (8, 0) else "fp16"
    if choice == "fp16" and device.type == "mps":  # float16 needs a GradScaler
        raise UsageError("--amp fp16 on mps: float16 needs a GradScaler, which MPS does not "
                         "support reliably; use --amp bf16 (macOS 14 or later)")
    return {"auto": torch.bfloat16, "bf16": torch.bfloat16, "fp16": torch.float16,
            None: None}[choice]  # "auto" left: a CPU, or Apple's or Intel's GPU


def make_deterministic() -> None:
    """--deterministic: forbid the GPU kernels whose sums vary from run to run."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before the first matmul
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False


def compile_problem(device: torch.device) -> str | None:
    """Why torch.compile (it writes C++ on the CPU, Triton on NVIDIA GPUs) cannot work, or None."""
    if device.type == "cuda" and importlib.util.find_spec("triton") is None:
        return "it needs Triton for NVIDIA GPUs, which is not installed (Windows wheels lack it)"
    ## The compiler torch.compile calls: cl.exe on Windows, else CXX if set, else g++ or clang++
    names = (["cl"] if sys.platform == "win32" else os.environ.get("CXX", "").split()[:1]
             or ["g++", "clang++", "c++"])
    if device.type == "cpu" and not any(map(shutil.which, names)):
        return (f"on the CPU it needs a C++ compiler, and {' or '.join(names)} was not found: "
                "install one (Visual Studio's Build Tools on Windows, Xcode's command line tools "
                "on a Mac), or fix CXX")
    return None


def note_missing_gpu(device: torch.device, asked: str) -> None:
    """Print a note, in the main process, when --device `asked` "auto" got the CPU although an
    NVIDIA driver is installed (nvidia-smi is looked up, never run: running it takes seconds)."""
    if asked != "auto" or device.type != "cpu" or not is_main_process() or shutil.which(
            "nvidia-smi") is None:
        return
    print("note: an NVIDIA driver is installed (nvidia-smi), but this runs on the CPU: " + (
        f"this PyTorch ({torch.__version__}) is a CPU-only build; install the CUDA build from "
        "https://pytorch.org/get-started/locally/" if torch.version.cuda is None else
        f"this PyTorch is built for CUDA {torch.version.cuda}, but it finds no usable GPU: the "
        "driver may be too old for it, or CUDA_VISIBLE_DEVICES hides the GPU"))


def memory_size(device: torch.device) -> int | None:
    """Bytes of memory that `device` has: the GPU's own, or the machine's RAM (None: unknown)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    with contextlib.suppress(AttributeError, ValueError, OSError):  # Windows has no sysconf
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")  # Apple's GPUs share it
    return None


def check_model_size(args: argparse.Namespace, sizes: dict, device: torch.device) -> None:
    """Refuse (UsageError) model sizes whose training cannot fit in `device`'s memory."""
    ## Built on the "meta" device, a model has shapes but no memory: its size costs nothing.
    with torch.device("meta"):
        weights = sum(p.numel() for p in common.build_model(args.model, **sizes).parameters())
    ## Training holds about 4 float32 copies: the weights, their gradients and Adam's two
    ## averages (SGD keeps one: a little less), and --ema's one more. Activations come on top.
    need, have = 4 * weights * (5 if args.ema else 4), memory_size(device)
    if sizes and have is not None and need > have:
        raise UsageError(f"{' '.join(as_words(args, ('hidden', 'channels')))} makes a model of "
                         f"{weights:,} weights: training it takes {need / 2**30:,.1f} GiB or "
                         f"more, and {'this GPU' if device.type == 'cuda' else 'this machine'} "
                         f"has {have / 2**30:,.1f} GiB; give smaller sizes")


# a training run ------------------------------------------------------------------------------
SCRIPT = "mnist_train.py"  # the script whose runs these are, as the commands to go on name it
## The settings that make a run what it is, saved with it: --resume goes on with them.
SETTINGS = ("model", "hidden", "channels", "dataset", "optimizer", "lr", "batch_size", "augment",
            "clip_grad", "amp", "seed", "val_size", "subset", "epochs", "schedule", "ema")


class Run:
    """`with Run(args, parser, argv) as run: train(args, run.prepare(sizes))`, then `run.code`:
    a run of mnist_train.py. Whatever stops it (an error, Ctrl-C, `kill`, a closed output), it
    ends with one line that says what is on disk; a usage error exits with code 2, as argparse's
    own do; only a bug shows its traceback."""

    def __init__(self, args: argparse.Namespace, parser: argparse.ArgumentParser,
                 argv: list[str] | None) -> None:
        self.args, self.parser, self.argv = args, parser, argv
        self.code, self.kept, self.held = 1, {}, None
        self.master = is_main_process()  # a plain run, or torchrun's process 0
        model = args.save_path or Path("checkpoints", f"{args.dataset.replace('-', '_')}_"
                                                      f"{args.model}.pt")
        if args.dry_run and not model.name.startswith("dry_run_"):  # never a real run's files
            model = model.with_name(f"dry_run_{model.name}")
        self.files = RunFiles.beside(model)
        self.ending = contextlib.ExitStack()

    def __enter__(self) -> "Run":
        printable_output()  # Windows' cp1252 console: a path's letter it lacks, escaped
        if self.argv is None:  # started from the command line, not called from Python:
            gc.freeze()  # what the imports made is never scanned by the collector again
        self.ending.callback(self.finish)
        self.ending.enter_context(stop_signals())  # `kill` and Ctrl-Break stop it as Ctrl-C does
        return self

    def prepare(self, sizes: dict) -> RunFiles:
        """Before any work: refuse what cannot work (a model of `sizes` too big, say), hold the
        save path, check what --resume goes on from, set an earlier run's files aside."""
        args = self.args
        args.epochs = 1 if args.dry_run else args.epochs
        try:
            device = common.get_device(args.device)
        except ValueError as err:
            raise UsageError(f"--device: {err}") from None
        if args.compile and (problem := compile_problem(device)):
            raise UsageError(f"--compile: {problem}; leave --compile out to train without it")
        if args.model == "mlp" and args.channels is not None:
            raise UsageError("--channels is for --model cnn; the MLP has --hidden only")
        if args.model == "cnn" and args.hidden is not None and len(args.hidden) != 1:
            raise UsageError("--model cnn has one hidden linear layer: give --hidden one size")
        check_model_size(args, sizes, device)  # --hidden, --channels beyond memory?
        if args.tensorboard and importlib.util.find_spec("tensorboard") is None:
            raise UsageError("--tensorboard needs the tensorboard package: pip install tensorboard")
        if self.master:  # the process that writes the files
            if problem := files.check_outputs(self.files, "--tensorboard", args.tensorboard):
                raise UsageError(problem)
            if not args.dry_run:  # a dry run's throwaway files are held by none
                self.held = files.hold(self.files.model, f"pid {os.getpid()} since "
                                       f"{time.strftime('%H:%M:%S')}: {command(self.argv)}")
        if args.resume:  # the saved run's settings, and whether it can go on
            check_resume(args, self.parser, self.argv, self.files)
        elif self.master and not args.dry_run:
            files.set_aside(self.files, self.kept)  # renamed, never replaced
        return self.files

    def __exit__(self, kind, err: BaseException | None, traceback) -> bool:
        with self.ending:  # then finish(), and the signals' handlers as they were
            return self.say_how_it_ended(err)

    def say_how_it_ended(self, err: BaseException | None) -> bool:
        """One line for `err` (True), or False for no error or a bug (its traceback shows)."""
        args = self.args
        if err is None:
            try:
                if sys.stdout is not None:  # None: started with stdout closed (`>&-`)
                    sys.stdout.flush()  # here, where a closed output can still be caught
                self.code = 0
                return False
            except OSError as flush_error:
                err = flush_error
        if isinstance(err, UsageError):
            self.parser.error(str(err))  # exit code 2, like argparse's own errors
        if isinstance(err, (KeyboardInterrupt, OSError)):  # Ctrl-C, `kill`, `| head` closed
            go_on = command(self.argv, "--resume")
            self.code = stopped(err, self.on_disk(go_on) if self.master else "")
            return True
        if isinstance(err, FloatingPointError):  # the loss became NaN or inf
            problem = (f"{err} With this script: --lr {args.lr / 10:g} or --clip-grad 1.0. "
                       f"{self.on_disk()}")
        elif isinstance(err, (files.DataError, files.CheckpointError, files.InUse)):
            problem = f"{str(err).rstrip('.')}."
        elif isinstance(err, files.OutputError):  # a full disk, say: what was saved is there
            problem = f"{err} {self.on_disk()}"
        elif isinstance(err, RuntimeError) and any(  # torch.OutOfMemoryError, a CPU's malloc
                words in str(err) for words in ("out of memory", "you tried to allocate")):
            problem = (f"out of memory: lower --batch-size (now {args.batch_size}) or the "
                       f"model's size (--hidden, --channels). {self.on_disk()}")
        else:
            return False
        rank = f" (rank {os.environ['RANK']})" if "RANK" in os.environ else ""  # torchrun's
        print(f"error{rank}: {problem}", file=sys.stderr)
        return True

    def on_disk(self, go_on: str | None = None) -> str:
        """What a run that stopped early leaves on disk, read from the files themselves."""
        model, last, kept, epochs = self.files.model, self.files.last, self.kept, self.args.epochs
        if not model.exists():
            return (f"This run saved nothing: {model}, an earlier run's, is unchanged."
                    if model in kept else "This run saved nothing yet.")
        best = files.read_checkpoint(model)
        done = files.read_checkpoint(last)["training"]["epoch"] if last.exists() else 0
        earlier = (f"; the earlier run's model is kept as {kept[model]}"
                   if model in kept else "")  # an earlier run may have left only its CSV
        next_step = (f" Training had finished ({epochs} of {epochs} epochs); only the final "
                     "test and the mistakes picture were cut short." if done == epochs
                     else f" To go on from the last epoch saved: {go_on}." if go_on and done
                     else "")
        return (f"{model} holds this run's best model so far (epoch {best['epoch']}, val acc "
                f"{best['val_accuracy']:.4f}), complete and loadable{earlier}.{next_step}")

    def finish(self) -> None:
        """Put back an earlier run's files if this run saved nothing; let go of what it held."""
        if self.code != 0 and not self.files.model.exists():
            for old, new in self.kept.items():
                os.replace(new, old)
        if self.held is not None:
            files.release(self.held)
        leave_distributed(wait=self.code == 0)


def check_resume(args: argparse.Namespace, parser: argparse.ArgumentParser,
                 argv: list[str] | None, run: RunFiles) -> None:
    """--resume: read the SETTINGS saved with the run into `args`, which must match those
    typed (--epochs may grow), and check that the run can go on."""
    if args.dry_run:
        raise UsageError("--resume goes on with a real run; a --dry-run has nothing to resume")
    if not (path := run.last).exists():
        raise UsageError(f"--resume: there is no run to resume at {run.model}: " + (
            f"{path.name}, the state to go on from, is not beside it (a dry run, or a version "
            "before it, saved none): start a new run without --resume" if run.model.exists()
            else "it saved no epoch yet (start it again without --resume), or it was started "
            "with another --save-path (or --model or --dataset): give that one"))
    files.read_checkpoint(run.model)  # the best so far, which the run goes on to beat: whole?
    state = files.read_checkpoint(path).get("training", {})
    try:  # the saved settings go through argparse's checks, as if typed: damage fails there
        parser.exit_on_error = False
        settings = list(state["settings"])  # None (damaged) fails here, not in argparse
        if "--loader" in settings:  # a flag that went: its value was the only loader there is
            del settings[settings.index("--loader") : settings.index("--loader") + 2]
        saved, extra = parser.parse_known_args(settings)
        missing = [k for k in ("epoch", "optimizer", "rng", "history") if k not in state]
        if extra or missing:
            raise ValueError(f"unknown settings {' '.join(extra)}" if extra else
                             f"it has no {missing[0]!r} part")
    except (argparse.ArgumentError, KeyError, TypeError, ValueError) as err:
        raise files.CheckpointError(f"{path} cannot be resumed: its training state is damaged "
                                    f"({err}): start a new run without --resume") from None
    finally:
        parser.exit_on_error = True
    given = {a.dest for a in parser._actions for o in a.option_strings for word in
             (sys.argv[1:] if argv is None else argv) if word == o or word.startswith(o + "=")}
    for name in SETTINGS:
        if name not in given:
            setattr(args, name, getattr(saved, name))
        elif getattr(args, name) != getattr(saved, name) and name != "epochs":
            said = [" " + " ".join(as_words(n, (name,))) if as_words(n, (name,)) else
                    f"out --{name.replace('_', '-')}" for n in (saved, args)]
            raise UsageError(f"--resume: this run was started with{said[0]}, not with{said[1]}; "
                             f"leave --{name.replace('_', '-')} out to go on with it, or start "
                             "a new run")
    done = state["epoch"]
    if args.schedule != "constant" and args.epochs != saved.epochs:  # planned over its epochs
        raise UsageError(f"--resume: this run's {args.schedule} learning rate was planned over "
                         f"{saved.epochs} epochs, so it cannot go on to {args.epochs}; leave "
                         "--epochs out, or start a new run")
    if args.epochs <= done:
        raise UsageError(f"--resume: this run's last saved epoch is {done}; pass --epochs with "
                         f"more than {done} to go on")
    if is_main_process():
        print(f"resuming {run.model}: epochs {done + 1} to {args.epochs}")


def check_sizes(args: argparse.Namespace, n_train: int) -> None:
    """Refuse a --val-size or --subset larger than the `n_train` training pictures allow."""
    if args.val_size >= n_train:
        raise UsageError(f"--val-size {args.val_size} leaves nothing to train on: the training "
                         f"set has {n_train} images")
    if args.subset is not None and args.subset > n_train - args.val_size:
        raise UsageError(f"--subset {args.subset} is larger than the {n_train - args.val_size} "
                         "training images left after the validation split")


def model_sizes(args: argparse.Namespace) -> dict:
    """--hidden and --channels as common.build_model() takes them ({}: the model's defaults)."""
    hidden = args.hidden if args.model == "mlp" or args.hidden is None else args.hidden[0]
    return {name: value for name, value in (("hidden", hidden), ("channels", args.channels))
            if value is not None}


def settings(args: argparse.Namespace) -> list[str]:
    """The SETTINGS of `args` as command-line words, as a run's files keep them for --resume."""
    return as_words(args, SETTINGS)


def command(argv: list[str] | None, flag: str | None = None) -> str:
    """The command that started this run (torchrun's too), `flag` added, quoted for the shell."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    words = (["python"] if world == 1 else ["torchrun", f"--nproc_per_node={world}"]) + [
        SCRIPT, *[w for w in (sys.argv[1:] if argv is None else argv) if w != flag],
        *([flag] if flag else [])]
    return subprocess.list2cmdline(words) if os.name == "nt" else shlex.join(words)


# Ctrl-C, kill and a closed output --------------------------------------------------------------
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM,  # Ctrl-C, and `kill` or a job scheduler
                *((signal.SIGBREAK,) if hasattr(signal, "SIGBREAK") else ()))  # Windows: Ctrl-Break


@contextlib.contextmanager
def stop_signals():
    """Inside the block, every stop signal raises KeyboardInterrupt, as Ctrl-C does: `finally`
    blocks then run, and the script says one line."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set handlers: the host program handles Ctrl-C
        return

    def stop(signum, frame):
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, stop) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def stopped(err: BaseException, on_disk: str, quiet_pipe: bool = False) -> int:
    """End a script stopped by Ctrl-C, `kill` or a failed stdout with one line; return its code."""
    if isinstance(err, KeyboardInterrupt):
        print(f"\ninterrupted: stopped. {on_disk}".rstrip(), file=sys.stderr)
        return 130
    ## A closed pipe (`| head`) is BrokenPipeError, or on Windows an EINVAL that carries neither
    ## a Windows error code nor a file name (CPython issue #79935). A full disk under
    ## `> log.txt` names no file either: the files this repo writes fail as OutputErrors.
    if isinstance(err, BrokenPipeError) or (
            sys.platform == "win32" and err.errno == errno.EINVAL
            and getattr(err, "winerror", None) is None and err.filename is None):
        why = "the program reading the output closed it"
    elif err.filename is None and err.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", None)):
        why = f"the output could not be written ({err.strerror})"
    else:
        raise err
    with contextlib.suppress(OSError):
        if not (quiet_pipe and "closed" in why):  # `| head` has its lines: a quiet end
            print(f"{'error' if quiet_pipe else 'stopped'}: {why}. {on_disk}".rstrip(),
                  file=sys.stderr)
        ## The signal module's "Note on SIGPIPE": stdout to /dev/null, so exit's flush cannot fail
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 1


def printable_output() -> None:
    """Let stdout and stderr print what their encoding lacks as escapes, not fail on it: on
    Windows' cp1252 a path with a Chinese letter prints as \\u6570, where print() would raise."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, ValueError):  # None, or a stream of another kind
            stream.reconfigure(errors="backslashreplace")


def run_script(main: Callable[[], int]) -> None:
    """Run a script's main() from the command line and exit with its code: Ctrl-C and `kill`
    with one line and code 130, a closed or full output with code 1, never a traceback."""
    printable_output()
    gc.freeze()  # what the imports made is never scanned by the collector again (docs/speed.md)
    try:
        with stop_signals():
            code = main()
            if sys.stdout is not None:  # None: started with stdout closed (`>&-`)
                sys.stdout.flush()  # here, where a closed pipe can still be caught
    except (KeyboardInterrupt, OSError) as err:
        code = stopped(err, "", quiet_pipe=True)
    sys.exit(code)


# predict.py's pictures: their names, and a line for each --------------------------------------
def expand_patterns(paths: list[Path]) -> list[Path]:
    """The paths, with patterns such as photos/*.jpg expanded where no shell did (Windows' cmd)."""
    found = []
    for path in paths:  # a file whose name looks like a pattern (photo[1].jpg) is that file
        matches = [] if os.path.exists(path) else sorted(map(Path, glob.glob(str(path))))
        found.extend(matches or [path])  # nothing matched: the path, which "no such file" names
    return found


def new_names(paths: list[Path], folder: Path | None) -> dict[Path, str]:
    """{path: the stem of its file in `folder`}: its own, or stem-2, -3..., never one of `paths`."""
    taken, names = {os.path.realpath(p).casefold() for p in paths}, {}  # as Windows, macOS compare
    for path in paths:
        name, n = path.stem, 1
        while (real := os.path.realpath(Path(folder or ".", name + ".png")).casefold()) in taken:
            n += 1
            name = f"{path.stem}-{n}"
        taken.add(real)
        names[path] = name
    return names


def say(line: str, stream=None) -> None:
    """Print a line of file names: their control characters show as \\\\n or \\\\x1b, as `ls`
    shows them, so that no name prints as two lines or recolours the terminal."""
    if stream is sys.stderr and sys.stdout is not None:
        sys.stdout.flush()  # `> log.txt 2>&1`: the lines in the order they were said
    print("".join(c if c.isprintable() else repr(c)[1:-1] for c in line), file=stream or sys.stdout)


def failure(err: Exception, expected: type, debug: bool, prefix: str) -> str:
    """Say what went wrong with one item of a batch, after `prefix`, and return it."""
    if debug and not isinstance(err, expected):
        traceback.print_exc()
    problem = str(err) if isinstance(err, expected) else (
        f"unexpected {type(err).__name__}: {(str(err).splitlines() or [''])[0]}. This is a bug, "
        "not a fault of the input: please report it with the input (--debug shows the traceback).")
    say(prefix + problem, sys.stderr)
    return problem


def save_input(path: Path, digit: torch.Tensor, result: dict) -> None:
    """Save the 28 x 28 image the model saw as a PNG, whole; if that fails, say so in one line
    and in `result` (predict.py's for the picture)."""
    pixels = bytes((digit * 255).round().to(torch.uint8).flatten().tolist())
    try:
        with files.written_whole(path) as f:
            Image.frombytes("L", (28, 28), pixels).save(f, format="PNG")
    except files.OutputError as err:  # classified, but what it saw cannot be saved
        problem = f"--save-input could not save what the model saw: {err}"
        result["save_input_error"] = problem
        say(f"{result['path']}: error: {problem}", sys.stderr)
