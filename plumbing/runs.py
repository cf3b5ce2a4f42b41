"""How a training run starts and ends, around the lesson: the checks before any work, the hold
on its save path, an earlier run's files set aside, and, whatever stops the run, one line that
says what is on disk and how to go on. run_script() ends the other scripts the same way."""

import argparse
import contextlib
import errno
import gc
import importlib.util
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import common
from plumbing import files, platforms
from plumbing.command_line import UsageError, as_words
from plumbing.files import RunFiles

SCRIPT = "mnist_train.py"  # the script whose runs these are, as the commands to go on name it
## The settings that make a run what it is, saved with it: --resume goes on with them.
SETTINGS = ("model", "hidden", "channels", "dataset", "optimizer", "lr", "batch_size", "augment",
            "clip_grad", "amp", "seed", "val_size", "subset", "epochs", "schedule", "ema")


class Run:
    """One run of mnist_train.py, from its checks to its last line:

        with Run(args, parser, argv) as run:
            train(args, run.prepare())
        return run.code  # 0 when the run went well

    Whatever stops the run (an error, Ctrl-C, `kill`, a closed output), it ends with one line
    that says what is on disk; only a bug shows its traceback. A usage error exits with code 2,
    as argparse's own do."""

    def __init__(self, args: argparse.Namespace, parser: argparse.ArgumentParser,
                 argv: list[str] | None) -> None:
        self.args, self.parser, self.argv = args, parser, argv
        self.code, self.kept, self.held = 1, {}, None
        self.master = platforms.is_main_process()  # a plain run, or torchrun's process 0
        model = args.save_path or Path("checkpoints", f"{args.dataset.replace('-', '_')}_"
                                                      f"{args.model}.pt")
        if args.dry_run and not model.name.startswith("dry_run_"):  # never a real run's files
            model = model.with_name(f"dry_run_{model.name}")
        self.files = RunFiles.beside(model)
        self.ending = contextlib.ExitStack()

    def __enter__(self) -> "Run":
        printable_output()  # Windows' cp1252 console: a path's letter it lacks, escaped
        self.ending.callback(self.finish)
        self.ending.enter_context(stop_signals())  # `kill` and Ctrl-Break stop it as Ctrl-C does
        return self

    def prepare(self) -> RunFiles:
        """Before any work: refuse what cannot work, hold the save path, check what --resume
        goes on from, and set an earlier run's files aside. Returns the run's files."""
        args = self.args
        args.epochs = 1 if args.dry_run else args.epochs
        try:
            device = common.get_device(args.device)
        except ValueError as err:
            raise UsageError(f"--device: {err}") from None
        if args.compile and (problem := platforms.compile_problem(device)):
            raise UsageError(f"--compile: {problem}; leave --compile out to train without it")
        if args.model == "mlp" and args.channels is not None:
            raise UsageError("--channels is for --model cnn; the MLP has --hidden only")
        if args.model == "cnn" and args.hidden is not None and len(args.hidden) != 1:
            raise UsageError("--model cnn has one hidden linear layer: give --hidden one size")
        platforms.check_model_size(args, model_sizes(args), device)  # beyond memory?
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
            if err is None:
                try:
                    if sys.stdout is not None:  # None: started with stdout closed (`>&-`)
                        sys.stdout.flush()  # here, where a closed output can still be caught
                    self.code = 0
                    return False
                except OSError as flush_error:
                    err = flush_error
            return self.say_how_it_ended(err)

    def say_how_it_ended(self, err: BaseException) -> bool:
        """One line for `err` (True), or False for a bug, whose traceback then shows."""
        args = self.args
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
        """Put an earlier run's files back if this run saved nothing, let go of the save path,
        and leave torchrun's processes (after the others, when the run went well)."""
        if self.code != 0 and not self.files.model.exists():
            for old, new in self.kept.items():
                os.replace(new, old)
        if self.held is not None:
            files.release(self.held)
        platforms.leave_distributed(wait=self.code == 0)


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
    if platforms.is_main_process():
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
