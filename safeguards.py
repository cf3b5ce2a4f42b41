"""What keeps the scripts working in real use, out of the lesson's way; each piece is one call.

Scripts import it, it imports common.py, never the reverse; it knows no script's flags or files.
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


def check_outputs(files: dict[str, Path], log_flag: str, log_dir: str | None) -> None:
    """Refuse (UsageError) unwritable `files` ({what messages call it: path}) and a bad log_dir."""
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
class RunFiles:
    """A run's checkpoint (best model; last epoch's state for --resume), .csv and _mistakes.png.
    An earlier run's are kept, renamed (mnist_mlp.2026-12-01_10-05-33.pt: the time they were
    written), so the newest model is where predict.py looks."""

    def __init__(self, checkpoint: Path, dry_run: bool = False) -> None:
        self.checkpoint, self.dry_run = checkpoint, dry_run
        self.csv = checkpoint.with_suffix(".csv")
        self.mistakes = checkpoint.with_name(f"{checkpoint.stem}_mistakes.png")
        self.resumed: dict | None = None  # --resume: the checkpoint this run goes on from
        self.saved: tuple[int, float] | None = None  # (epoch, val acc) of the best on disk
        self.last_epoch = 0  # the last epoch whose training state is on disk
        self.kept: Path | None = None  # where the earlier run's checkpoint was moved

    @contextlib.contextmanager
    def saving(self, epoch: int, best: tuple[int, float]):
        """Around an epoch's writes: Ctrl-C waits until they are all done, and at this run's
        first save an earlier run's files are renamed first (and back if a write fails)."""
        with stop_signals(hold=True):
            moves = self.earlier_files() if self.saved is None and not self.resumed else {}
            done = []
            try:
                for old, new in moves.items():
                    try:
                        os.replace(old, new)
                    except OSError as err:
                        raise common.OutputError(f"could not rename the earlier run's {old}: "
                                                 f"{err.strerror}. Nothing was replaced") from err
                    done.append((old, new))
                yield
            except BaseException:
                for old, new in reversed(done):
                    os.replace(new, old)
                raise
            self.saved, self.last_epoch = best, epoch
            self.kept = moves.get(self.checkpoint, self.kept)
        if moves:  # said after the writes, which a closed output then cannot stop
            (old, new), *rest = moves.items()
            extras = [p.name.removeprefix(self.checkpoint.stem) for p, _ in rest]
            print(f"an earlier run's files are kept: {old} -> {new}"
                  + (f", with its {' and '.join(extras)}" if extras else ""))

    def earlier_files(self) -> dict[Path, Path]:
        """{an earlier run's file: its stamped name}; a dry run's are replaced by a dry run."""
        mine = [p for p in (self.checkpoint, self.csv, self.mistakes) if p.exists()]
        with contextlib.suppress(common.CheckpointError):  # a damaged file is kept, as any
            if not mine or self.dry_run and mine[0] == self.checkpoint and (
                    common.load_checkpoint(self.checkpoint).get("training", 1) is None):
                return {}
        stamp = time.strftime("%Y-%m-%d_%H-%M-%S", time.localtime(mine[0].stat().st_mtime))
        for n in range(1, 1000):  # two runs saved in the same second: -2, -3, ...
            name = f"{self.checkpoint.stem}.{stamp}{f'-{n}' if n > 1 else ''}"
            new = RunFiles(self.checkpoint.with_name(name + self.checkpoint.suffix))
            if not any(p.exists() for p in (new.checkpoint, new.csv, new.mistakes)):
                break
        return {old: n for old, n in zip((self.checkpoint, self.csv, self.mistakes),
                                         (new.checkpoint, new.csv, new.mistakes)) if old in mine}

    def training_state(self, epoch: int, history: list) -> dict | None:
        """What --resume needs to go on after `epoch` as if never stopped (a dry run: none)."""
        return None if self.dry_run else {
            "epoch": epoch, "history": history, "settings": self.settings,
            "rng": torch.get_rng_state(),
            **{name: thing.state_dict() for name, thing in self.objects.items() if thing}}

    def begin(self, settings: list[str], **objects) -> tuple[float, int, dict | None, list]:
        """Keep what --resume needs saved (the settings as command-line words, objects' state);
        put a resumed run's back. Return the best accuracy, epoch, weights, history so far."""
        self.settings, self.objects = settings, objects
        if not self.resumed:
            return -1.0, 0, None, []
        state = self.resumed["training"]
        try:
            for name, thing in self.objects.items():
                if thing is not None:
                    thing.load_state_dict(state[name])
        except (KeyError, TypeError, ValueError, RuntimeError) as err:
            lines = [line.strip() for line in str(err).splitlines() if line.strip()] + [""] * 2
            raise common.CheckpointError(f"--resume: the training state does not fit the model "
                                         f"its settings describe ({lines[1].rstrip('. ')}): start "
                                         "a new run without --resume") from None
        ## The CPU's random numbers (dropout, --augment), as if never interrupted. Under
        ## torchrun only rank 0's were saved, and each rank draws its own: they keep theirs.
        if "WORLD_SIZE" not in os.environ:  # not under torchrun
            torch.set_rng_state(state["rng"])
        return (self.resumed["val_accuracy"], self.resumed["epoch"], self.resumed["state_dict"],
                state["history"])

    def on_disk(self, go_on: str | None, epochs: int) -> str:
        """What is on disk now, for the line that ends a stopped run."""
        if self.saved is None:
            return (f"This run saved nothing: {self.checkpoint}, an earlier run's, is unchanged."
                    if self.checkpoint.exists() else "This run saved nothing yet.")
        kept = f"; the earlier run's model is kept as {self.kept}" if self.kept else ""
        next_step = (f" Training had finished ({epochs} of {epochs} epochs); only the final test "
                     "and the mistakes picture were cut short." if self.last_epoch == epochs
                     else f" To go on from the last epoch saved: {go_on}." if go_on else "")
        return (f"{self.checkpoint} holds this run's best model so far (epoch {self.saved[0]}, "
                f"val acc {self.saved[1]:.4f}), complete and loadable{kept}.{next_step}")


def as_words(args: argparse.Namespace, names: tuple[str, ...]) -> list[str]:
    """Settings as command-line words: ['--lr', '0.001', '--augment', '--hidden', '128', '64']."""
    words = []
    for name in names:
        value = getattr(args, name)
        if value is not None and value is not False:
            words += [f"--{name.replace('_', '-')}", *map(str, value if isinstance(value, list)
                                                           else [] if value is True else [value])]
    return words


def load_training_state(run: RunFiles, args: argparse.Namespace, parser: argparse.ArgumentParser,
                        argv: list[str] | None, names: tuple[str, ...],
                        may_change: tuple[str, ...] = ()) -> argparse.Namespace:
    """--resume: read run.checkpoint into run.resumed and its settings (`names`) into `args`, which
    must match those typed, except `may_change`; return the saved settings."""
    checkpoint = common.load_checkpoint(run.checkpoint)
    if not isinstance(state := checkpoint.get("training"), dict):
        raise UsageError(f"--resume: {run.checkpoint} holds no training state (a dry run's, or "
                         "saved before --resume existed): start a new run without --resume")
    try:  # the saved settings go through argparse's checks, as if typed: damage fails there
        parser.exit_on_error = False
        saved, extra = parser.parse_known_args(list(state["settings"]))  # None: reads sys.argv
        missing = [k for k in ("epoch", "model", "optimizer", "rng", "history") if k not in state]
        if extra or missing:
            raise ValueError(f"unknown settings {' '.join(extra)}" if extra else
                             f"it has no {missing[0]!r} part")
    except (argparse.ArgumentError, KeyError, TypeError, ValueError) as err:
        raise common.CheckpointError(f"{run.checkpoint} cannot be resumed: its training state is "
                                     f"damaged ({err}): start a new run without --resume") from None
    finally:
        parser.exit_on_error = True
    given = {a.dest for a in parser._actions for o in a.option_strings for word in
             (sys.argv[1:] if argv is None else argv) if word == o or word.startswith(o + "=")}
    for name in names:
        if name not in given:
            setattr(args, name, getattr(saved, name))
        elif getattr(args, name) != getattr(saved, name) and name not in may_change:
            said = [" " + " ".join(as_words(n, (name,))) if as_words(n, (name,)) else
                    f"out --{name.replace('_', '-')}" for n in (saved, args)]
            raise UsageError(f"--resume: this run was started with{said[0]}, not with{said[1]}; "
                             f"leave --{name.replace('_', '-')} out to go on with it, or start "
                             "a new run")
    run.resumed, run.saved = checkpoint, (checkpoint["epoch"], checkpoint["val_accuracy"])
    run.last_epoch = state["epoch"]
    return saved


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
def stop_signals(hold: bool = False):
    """Inside the block, every stop signal raises KeyboardInterrupt, as Ctrl-C does (`finally`
    blocks then run, and the script says one line); with hold=True, only after the block."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set handlers: the host program handles Ctrl-C
        return
    received = []

    def stop(signum, frame):
        if not hold:
            raise KeyboardInterrupt
        received.append(signum)

    previous = {sig: signal.signal(sig, stop) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if received:
        raise KeyboardInterrupt


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


def run_script(main: Callable[[], int]) -> None:
    """Run a script's main() from the command line and exit with its code: Ctrl-C and `kill`
    with one line and code 130, a closed or full output with code 1, never a traceback."""
    for stream in (sys.stdout, sys.stderr):  # Windows' cp1252: a letter it lacks prints as \xe9
        with contextlib.suppress(AttributeError, ValueError):
            stream.reconfigure(errors="backslashreplace")
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
## `torchrun --nproc_per_node=N script.py` starts N copies of the script, "ranks" 0..N-1, which
## find their numbers in environment variables; each trains on its share of every batch.
def init_distributed(device: torch.device) -> tuple[int, int, torch.device]:
    """Join torchrun's processes, if this is one of them; return (rank, world size, device)."""
    if "WORLD_SIZE" not in os.environ:  # a plain `python script.py`
        return 0, 1, device
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
    return dist.get_rank(), dist.get_world_size(), device


def is_main_process() -> bool:
    """True in a plain run and on rank 0, also before the processes have joined."""
    return os.environ.get("RANK", "0") == "0"


def reduce_metrics(train_loss: float, val_loss: float, val_acc: float, val_count: int,
                   world: int, device: torch.device) -> tuple[float, float, float]:
    """This rank's numbers made whole-dataset ones (unchanged in a plain run)."""
    if world == 1:
        return train_loss, val_loss, val_acc
    ## Training shards are padded to equal sizes, so the training loss is the mean of the
    ## ranks' means. Validation shards are not: sum the totals over ranks, then divide once.
    sums = torch.tensor([train_loss, val_loss * val_count, val_acc * val_count, val_count],
                        dtype=torch.float64, device=device)  # float64: exact enough sums
    torch.distributed.all_reduce(sums)
    train_sum, loss_sum, correct, total = sums.tolist()
    return train_sum / world, loss_sum / total, correct / total


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
    if choice == "auto" and device.type == "cuda" and torch.version.hip:  # AMD: ask ROCm
        with torch.cuda.device(device):
            choice = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    elif choice == "auto" and device.type == "cuda":  # NVIDIA: native from Ampere (8.0) on
        ## Not torch.cuda.is_bf16_supported(): it says True where bfloat16 is only emulated
        ## (T4, V100, RTX 20xx: slower than float32), and about the current GPU, not `device`.
        choice = "bf16" if torch.cuda.get_device_capability(device) >= (8, 0) else "fp16"
    if choice == "fp16" and device.type == "mps":  # float16 needs a GradScaler
        raise UsageError("--amp fp16 on mps: float16 needs a GradScaler, which MPS does not "
                         "support reliably; use --amp bf16 (macOS 14 or later)")
    return {"auto": torch.bfloat16, "bf16": torch.bfloat16, "fp16": torch.float16,
            None: None}[choice]  # "auto" left: a CPU, or Apple's or Intel's GPU


def set_maths(device: torch.device, deterministic: bool) -> None:
    """Faster maths where no result that matters changes, and --deterministic's rules."""
    torch.set_flush_denormal(True)  # float32 below 1e-38, slow on many CPUs, as 0 (docs/speed.md)
    if device.type == "cuda":  # TF32: float32 matmuls on tensor cores, with a shorter mantissa
        torch.set_float32_matmul_precision("high")
    if deterministic:  # GPUs: forbid the kernels whose sums vary from run to run
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


def missing_gpu_note(device: torch.device) -> str | None:
    """A note, for the main process, when `device` is the CPU although an NVIDIA driver is
    installed (nvidia-smi is looked up, never run: running it takes seconds); else None."""
    if device.type != "cpu" or not is_main_process() or shutil.which("nvidia-smi") is None:
        return None
    return "note: an NVIDIA driver is installed (nvidia-smi), but this runs on the CPU: " + (
        f"this PyTorch ({torch.__version__}) is a CPU-only build; install the CUDA build from "
        "https://pytorch.org/get-started/locally/" if torch.version.cuda is None else
        f"this PyTorch is built for CUDA {torch.version.cuda}, but it finds no usable GPU: the "
        "driver may be too old for it, or CUDA_VISIBLE_DEVICES hides the GPU")
