"""What keeps the scripts working in real use, out of the lesson's way; each piece is one call.

Scripts import it, it imports common.py, never the reverse. Where the fix for a problem is a
flag, its message names the flag.
"""

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
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import torch

import common


class UsageError(Exception):
    """A command line that cannot work, found after parsing: reported as argparse's errors are."""


# command lines --------------------------------------------------------------------------------
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


def check_outputs(run: "RunFiles", log_flag: str, log_dir: str | None) -> None:
    """Refuse (UsageError) a run's files that cannot be written, and a bad log_dir."""
    files = {"--save-path": run.model, "its state for --resume": run.last, "its CSV": run.csv,
             "its mistakes picture": run.mistakes}  # as the messages name them
    same = [os.path.abspath(p).casefold() for p in files.values()]  # m.CSV is m.csv on Windows
    if len(set(same)) < len(same):  # --save-path m.csv: the metrics would be written over it
        what, path = next(iter(files.items()))
        raise UsageError(f"{what} {path}: the run's other files would be written over it; give "
                         "it another suffix, such as .pt")
    for what, path in files.items():
        if problem := check_output_file(path):
            raise UsageError(f"{what} {path}: {problem}")
    if log_dir is not None:
        if not log_dir.strip() or os.path.abspath(log_dir).casefold() in same:
            raise UsageError(f"{log_flag} {log_dir!r}: give it a folder of its own, such as "
                             "runs/mnist")
        if importlib.util.find_spec("tensorboard") is None:
            raise UsageError(f"{log_flag} needs the tensorboard package: pip install tensorboard")
        if problem := check_output_dir(log_dir):
            raise UsageError(f"{log_flag} {log_dir}: {problem}")


def check_output_file(path: str | Path) -> str | None:
    """Why common.write_atomically cannot write `path`, or None. Creates its folder."""
    if os.path.isdir(path):
        return "is a directory; give a file name inside it"
    if os.path.exists(path) and not os.path.isfile(path):  # /dev/null, a FIFO: never replaced
        return ("is not a regular file (a device or a pipe), and will not be replaced. To keep "
                "nothing, save into a temporary folder instead")
    real = Path(os.path.realpath(path))
    try:  # permissions, a read-only disk, a name too long: only writing tells for sure
        real.parent.mkdir(parents=True, exist_ok=True)
        (probe := common.temporary_name(real)).touch(exist_ok=False)  # the longer name, too
        probe.unlink()
    except FileExistsError:
        return f"{real.parent} exists and is not a folder"
    except OSError as err:
        return (f"cannot be written: {err.strerror}" if err.errno == errno.ENAMETOOLONG else
                f"cannot write files in {real.parent}: {err.strerror}")
    return None


def check_output_dir(folder: str | Path) -> str | None:
    """Why files cannot be written in `folder`, or None. Creates the folder."""
    return check_output_file(Path(folder, ".write-test"))


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


# the files of a training run, and --resume ---------------------------------------------------
class RunFiles(NamedTuple):
    """A run's files: the best model (which predict.py loads), the last epoch's state (which
    --resume goes on from), the metrics (.csv) and the pictures of the mistakes."""
    model: Path
    last: Path
    csv: Path
    mistakes: Path

    @classmethod
    def beside(cls, model: Path) -> "RunFiles":
        return cls(model, model.with_name(f"{model.stem}_last{model.suffix}"),
                   model.with_suffix(".csv"), model.with_name(f"{model.stem}_mistakes.png"))


def set_aside(files: RunFiles, moved: dict[Path, Path]) -> None:
    """Rename an earlier run's files, so that a new run never replaces them, to names stamped
    with the time its model was written (mnist_mlp.2026-12-01_10-05-33.pt), and say so. `moved`
    gets {old: new} as they go: the caller can undo it, even after a failure halfway."""
    found, stem = [p for p in files if p.exists()], files.model.stem
    if not found:
        return
    stamp = time.strftime("%Y-%m-%d_%H-%M-%S", time.localtime(found[0].stat().st_mtime))
    for n in range(1, 1000):  # two runs saved in the same second: -2, -3, ...
        tag = f"{stamp}-{n}" if n > 1 else stamp
        moves = {p: p.with_name(f"{stem}.{tag}{p.name[len(stem):]}") for p in found}
        if not any(new.exists() for new in moves.values()):
            break
    for old, new in moves.items():
        try:
            os.replace(old, new)
        except OSError as err:
            raise common.OutputError(f"could not rename the earlier run's {old}: {err.strerror}. "
                                     "Nothing was replaced") from err
        moved[old] = new
    (old, new), *rest = moves.items()
    extras = [p.name[len(stem):] for p, _ in rest]
    print(f"an earlier run's files are kept: {old} -> {new}"
          + (f", with its {', '.join(extras)}" if extras else ""))


def save_state(path: Path, state: dict, history: list, args: argparse.Namespace,
               names: tuple[str, ...], **about) -> None:
    """Save the last epoch's model (state["model"]) and what else training changes (the state of
    `state`'s other objects, the random numbers, the `history` of epochs, the settings `names`
    of `args`): --resume goes on from there. It loads in predict.py like any checkpoint."""
    if args.dry_run:  # one batch: nothing to go on with
        return
    epoch, val_acc = history[-1][0], history[-1][3]
    training = {"epoch": epoch, "history": history, "settings": as_words(args, names),
                "rng": torch.get_rng_state(),
                **{name: thing.state_dict() for name, thing in state.items()
                   if thing is not None and name != "model"}}
    common.save_checkpoint(path, state["model"], epoch=epoch, val_accuracy=val_acc,
                           training=training, **about)


def resume(path: Path, state: dict) -> tuple[int, int, float, list]:
    """Load save_state()'s file back into `state`'s objects; return the epoch to go on with,
    the best epoch so far and its accuracy, and the history of epochs."""
    checkpoint = common.load_checkpoint(path)
    saved = checkpoint["training"]  # check_resume() checked it before any work
    try:
        for name, thing in state.items():
            if thing is not None:
                thing.load_state_dict(checkpoint["state_dict"] if name == "model" else saved[name])
    except (KeyError, TypeError, ValueError, RuntimeError) as err:
        lines = [line.strip() for line in str(err).splitlines() if line.strip()] + [""] * 2
        raise common.CheckpointError(f"--resume: the training state does not fit the model its "
                                     f"settings describe ({lines[1].rstrip('. ')}): start a new "
                                     "run without --resume") from None
    ## The CPU's random numbers (dropout, --augment), as if never stopped. Under torchrun only
    ## process 0's were saved, and each process draws its own: they keep theirs.
    if common.process_count() == 1:
        torch.set_rng_state(saved["rng"])
    history = saved["history"]
    best = max(history, key=lambda row: row[3])  # the first epoch at the best accuracy: saved
    return saved["epoch"] + 1, best[0], best[3], history


def on_disk(files: RunFiles, kept: dict[Path, Path], epochs: int, go_on: str | None = None) -> str:
    """What a run that stopped early leaves on disk, read from the files themselves."""
    if not files.model.exists():
        return (f"This run saved nothing: {files.model}, an earlier run's, is unchanged."
                if files.model in kept else "This run saved nothing yet.")
    best = common.load_checkpoint(files.model)
    done = common.load_checkpoint(files.last)["training"]["epoch"] if files.last.exists() else 0
    earlier = (f"; the earlier run's model is kept as {kept[files.model]}"
               if files.model in kept else "")  # an earlier run may have left only its CSV
    next_step = (f" Training had finished ({epochs} of {epochs} epochs); only the final test "
                 "and the mistakes picture were cut short." if done == epochs
                 else f" To go on from the last epoch saved: {go_on}." if go_on and done else "")
    return (f"{files.model} holds this run's best model so far (epoch {best['epoch']}, val acc "
            f"{best['val_accuracy']:.4f}), complete and loadable{earlier}.{next_step}")


def as_words(args: argparse.Namespace, names: tuple[str, ...]) -> list[str]:
    """Settings as command-line words: ['--lr', '0.001', '--augment', '--hidden', '128', '64']."""
    words = []
    for name in names:
        value = getattr(args, name)
        if value is not None and value is not False:
            words += [f"--{name.replace('_', '-')}", *map(str, value if isinstance(value, list)
                                                           else [] if value is True else [value])]
    return words


def check_resume(args: argparse.Namespace, parser: argparse.ArgumentParser,
                 argv: list[str] | None, files: RunFiles, names: tuple[str, ...]) -> None:
    """--resume: read the settings (`names`) saved with the run into `args`, which must match
    those typed (--epochs may grow), and check that the run can go on."""
    if args.dry_run:
        raise UsageError("--resume goes on with a real run; a --dry-run has nothing to resume")
    if not (path := files.last).exists():
        raise UsageError(f"--resume: there is no run to resume at {files.model}: " + (
            f"{path.name}, the state to go on from, is not beside it (a dry run, or a version "
            "before it, saved none): start a new run without --resume" if files.model.exists()
            else "it saved no epoch yet (start it again without --resume), or it was started "
            "with another --save-path (or --model or --dataset): give that one"))
    common.load_checkpoint(files.model)  # the best so far, which the run goes on to beat: whole?
    state = common.load_checkpoint(path).get("training", {})
    try:  # the saved settings go through argparse's checks, as if typed: damage fails there
        parser.exit_on_error = False
        saved, extra = parser.parse_known_args(list(state["settings"]))  # None: reads sys.argv
        missing = [k for k in ("epoch", "optimizer", "rng", "history") if k not in state]
        if extra or missing:
            raise ValueError(f"unknown settings {' '.join(extra)}" if extra else
                             f"it has no {missing[0]!r} part")
    except (argparse.ArgumentError, KeyError, TypeError, ValueError) as err:
        raise common.CheckpointError(f"{path} cannot be resumed: its training state is damaged "
                                     f"({err}): start a new run without --resume") from None
    finally:
        parser.exit_on_error = True
    given = {a.dest for a in parser._actions for o in a.option_strings for word in
             (sys.argv[1:] if argv is None else argv) if word == o or word.startswith(o + "=")}
    for name in names:
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
        print(f"resuming {files.model}: epochs {done + 1} to {args.epochs}")


def command_to_go_on(script: str, argv: list[str] | None, flag: str) -> str:
    """The command that started this script (torchrun's too), `flag` added, quoted for the shell."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    words = (["python"] if world == 1 else ["torchrun", f"--nproc_per_node={world}"]) + [
        script, *[w for w in (sys.argv[1:] if argv is None else argv) if w != flag], flag]
    return subprocess.list2cmdline(words) if os.name == "nt" else shlex.join(words)


def download_mnist(data_dir: str | Path, dataset: str) -> None:
    """Fetch <data_dir>/<dataset>/raw/ with torchvision if a file is missing; failing: DataError."""
    raw = (data_dir := Path(data_dir)) / dataset / "raw"
    if all((raw / f"{split}-{kind}-ubyte").exists() for split in ("train", "t10k")
           for kind in ("images-idx3", "labels-idx1")):
        return
    from torchvision import datasets  # only now: its import alone takes seconds

    for folder in (data_dir / "raw", data_dir):  # data_dir named MNIST/raw or MNIST itself?
        if (folder / "train-images-idx3-ubyte").exists():
            root = folder.parent.parent if folder.name == "raw" else folder.parent
            raise common.DataError(f"{dataset} is not in {raw}/, but its files are in {folder}/: "
                                   f"give {root} as the data folder (it holds {dataset}/raw/)")
    new, timeout = [f for f in (raw, *raw.parents) if not f.exists()], socket.getdefaulttimeout()
    socket.setdefaulttimeout(30)  # a blocked network fails after 30 s instead of hanging
    try:
        getattr(datasets, dataset)(root=data_dir, download=True)
    except (RuntimeError, OSError) as err:  # offline, a blocked mirror, a bad .gz, a full disk
        for folder in new:  # no empty folders left behind by a typo in the path
            with contextlib.suppress(OSError):
                folder.rmdir()
        reason = ([line.strip() for line in str(err).splitlines() if line.strip()]
                  or [type(err).__name__])[-1].rstrip(".")  # the last mirror's answer
        raise common.DataError(f"{dataset} is not in {raw}/ and downloading it failed: {reason}. "
                               f"Run once online, or put its four files into {raw}/, unpacked "
                               "(gunzip -k a .gz that torchvision's checksum refuses)") from None
    finally:
        socket.setdefaulttimeout(timeout)


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


# torchrun -------------------------------------------------------------------------------------
def init_distributed(device: torch.device) -> tuple[int, torch.device]:
    """Join the other processes that torchrun started; return (this one's rank, its device)."""
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


def is_main_process() -> bool:
    """True in a plain run and on rank 0, also before the processes have joined."""
    return os.environ.get("RANK", "0") == "0"


def leave_distributed(wait: bool) -> None:
    """Leave torchrun's process group; after the others (`wait`) when the run went well."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        if wait:  # a rank that leaves while another still works can bring the whole run down
            torch.distributed.barrier()
        torch.distributed.destroy_process_group()


# platform rules -------------------------------------------------------------------------------
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


def note_missing_gpu(device: torch.device) -> None:
    """Print a note, in the main process, when `device` is the CPU although an NVIDIA driver is
    installed (nvidia-smi is looked up, never run: running it takes seconds)."""
    if device.type != "cpu" or not is_main_process() or shutil.which("nvidia-smi") is None:
        return
    print("note: an NVIDIA driver is installed (nvidia-smi), but this runs on the CPU: " + (
        f"this PyTorch ({torch.__version__}) is a CPU-only build; install the CUDA build from "
        "https://pytorch.org/get-started/locally/" if torch.version.cuda is None else
        f"this PyTorch is built for CUDA {torch.version.cuda}, but it finds no usable GPU: the "
        "driver may be too old for it, or CUDA_VISIBLE_DEVICES hides the GPU"))


# memory -----------------------------------------------------------------------------------------
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

