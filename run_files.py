"""The files of a training run: where mnist_train.py saves, keeps earlier runs, and resumes.

A run writes its best checkpoint (checkpoints/mnist_mlp.pt), the metrics of every epoch beside
it (.csv), a picture of the test set's mistakes (_mistakes.png), and the state to go on from
after each epoch (_resume.pt: the last epoch's weights, the optimizer, the random numbers).
This module decides what happens to an earlier run's files when a new run saves where it
saved (at the new run's first save), and puts a saved state back for --resume. It is
machinery, not part of the lesson: mnist_train.main() and train() call it.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch import nn

import common


class ResumeError(ValueError):
    """--resume cannot go on with the run it was asked to: a one-line reason."""


class RunOutputs:
    """The files a run writes, and what became of an earlier run's files at the same path."""

    ## "Best" means best within one run: a new run's first epoch is usually worse than the end
    ## of the last one. So a new run never writes over an earlier run's files. At its first
    ## save it renames them, stamped with the time the earlier checkpoint was written:
    ## mnist_mlp.pt -> mnist_mlp.2026-12-01_10-05-33.pt (and the .csv, _mistakes.png and
    ## _resume.pt).
    ## The new run's best model then always sits at the usual path, where predict.py looks.
    ## Beside it, mnist_mlp_resume.pt holds the last epoch's weights and optimizer, for --resume.

    def __init__(self, checkpoint: Path, dry_run: bool) -> None:
        self.checkpoint, self.dry_run = checkpoint, dry_run
        self.csv = checkpoint.with_suffix(".csv")
        self.mistakes = mistakes_path(checkpoint)
        self.resume = checkpoint.with_name(f"{checkpoint.stem}_resume.pt")
        self.earlier: Path | None = None  # where the earlier run's checkpoint now is
        self.saved: tuple[int, float] | None = None  # (epoch, val acc) this run has on disk
        self.state: dict | None = None  # with --resume: the state this run goes on from
        self.last_epoch = 0  # the last epoch whose training state is on disk (0: none yet)

    def save_training_state(self, state: dict) -> None:
        """Write what --resume needs to go on after this epoch; a failure only warns."""
        if self.dry_run:
            return
        buffer = io.BytesIO()
        torch.save(state, buffer)
        try:
            common.write_atomically(self.resume, buffer.getvalue())
            self.last_epoch = state["epoch"]
        except common.OutputError as err:  # the run goes on; --resume loses this epoch
            removed = ""
            if self.saved and self.saved[0] == state["epoch"]:
                ## This epoch's model is the new best: the older state beside it names another
                ## best, and --resume would refuse it as another run's. It goes, and says so.
                older, self.last_epoch = self.last_epoch, 0
                try:
                    self.resume.unlink()
                    removed = (f": that file, the state after epoch {older}, is now removed, "
                               "since it goes with an earlier best model")
                except FileNotFoundError:  # there was none
                    pass
                except OSError as gone:
                    removed = (f"; the state after epoch {older} goes with an earlier best model "
                               f"and could not be removed ({gone.strerror}): --resume will "
                               "refuse it")
            print(f"warning: {err} --resume cannot continue from epoch {state['epoch']}"
                  + ("" if self.last_epoch else ", nor from an earlier one") + removed + ".",
                  file=sys.stderr)

    @contextlib.contextmanager
    def keeping_earlier_run(self, epoch: int, val_acc: float):
        """Around a save: first rename an earlier run's files beside them (first save only)."""
        ## None to rename when resuming (the same run), or when a dry run replaces its own file.
        first_save = self.saved is None and self.state is None and not (
            self.dry_run and was_dry_run(self.checkpoint))
        moves = self._new_names() if first_save else {}
        details = describe_checkpoint(self.checkpoint) if moves else ""
        done = []  # (old, new) pairs renamed so far, undone if the save fails

        def undo():
            for old, new in reversed(done):
                os.replace(new, old)

        try:
            for old, new in moves.items():
                os.replace(old, new)
                done.append((old, new))
        except OSError as err:
            undo()
            raise common.OutputError(f"could not rename the earlier run's {old} to {new}: "
                                     f"{err.strerror}. Nothing was replaced.") from err
        try:
            yield
        except BaseException:  # the save failed: the earlier run's files go back as they were
            undo()
            raise
        self.saved = (epoch, val_acc)
        if moves:
            first_old, first_new = next(iter(moves.items()))
            self.earlier = moves.get(self.checkpoint)
            extras = [old.name.removeprefix(self.checkpoint.stem) for old in moves
                      if old != first_old]  # .csv, _mistakes.png, _resume.pt
            ## A closed output (`| head`), or a full disk under `> log.txt`, must not keep the CSV
            ## and the training state from being written with the checkpoint: the run's next
            ## print stops it instead.
            try:
                print(f"an earlier run's files are kept: {first_old} -> {first_new}{details}"
                      + (f", with its {', '.join(extras[:-1])}{' and ' if len(extras) > 1 else ''}"
                         f"{extras[-1]}" if extras else ""))
            except OSError as err:
                if common.output_failure(err) is None:
                    raise

    def _new_names(self) -> dict[Path, Path]:
        """{earlier run's file: its new, stamped name} for the files that exist."""
        found = [p for p in (self.checkpoint, self.csv, self.mistakes, self.resume)
                 if p.exists()]
        if not found:
            return {}
        written = time.localtime(found[0].stat().st_mtime)  # the checkpoint's, if there is one
        stamp = time.strftime("%Y-%m-%d_%H-%M-%S", written)  # no ":", which Windows forbids
        for n in range(1, 1000):  # two runs saved in the same second: add -2, -3, ...
            new = self.checkpoint.with_name(f"{self.checkpoint.stem}.{stamp}"
                                            f"{'' if n == 1 else f'-{n}'}{self.checkpoint.suffix}")
            names = {self.checkpoint: new, self.csv: new.with_suffix(".csv"),
                     self.mistakes: mistakes_path(new),
                     self.resume: new.with_name(f"{new.stem}_resume.pt")}
            if not any(p.exists() for p in names.values()):
                break
        return {old: names[old] for old in found}

    def on_disk(self, resume_command: str, epochs: int) -> str:
        """What is on disk now, for the message after Ctrl-C or a closed output."""
        go_on = (f" To go on from the last epoch saved: {resume_command}."
                 if self.last_epoch else "")
        if self.last_epoch == epochs:  # stopped in the final test: there is nothing to go on with
            go_on = (f" Training had finished ({epochs} of {epochs} epochs); only the final "
                     "test and the mistakes picture were cut short.")
        if self.saved is None:
            if self.checkpoint.exists():
                return (f"This run saved nothing: {self.checkpoint}, an earlier run's, is "
                        f"unchanged.{go_on}")
            return f"This run saved nothing yet.{go_on}"
        epoch, acc = self.saved
        kept = f"; the earlier run's model is kept as {self.earlier}" if self.earlier else ""
        return (f"{self.checkpoint} holds this run's best model so far (epoch {epoch}, val acc "
                f"{acc:.4f}), complete and loadable{kept}.{go_on}")


## The settings that make a run what it is, kept with its training state: --resume takes them
## from there, so that the resumed run goes on as it would have without a break (on a CPU,
## exactly: see resume_training).
RUN_SETTINGS = ("model", "hidden", "channels", "dataset", "optimizer", "lr", "batch_size",
                "augment", "clip_grad", "amp", "seed", "val_size", "subset", "loader", "epochs",
                "schedule", "ema")


def run_settings(args: argparse.Namespace) -> dict:
    """The run's RUN_SETTINGS, read from args, to save with its training state."""
    return {name: getattr(args, name) for name in RUN_SETTINGS}


def load_training_state(args: argparse.Namespace, parser: argparse.ArgumentParser,
                        argv: list[str] | None, outputs: RunOutputs) -> None:
    """For --resume: read the run's training state, and take its settings into `args`.

    The settings given on the command line (argv, parsed by `parser`) must match the saved
    run's; the others come from it.
    """
    given = given_on_command_line(parser, argv)
    if args.dry_run:
        raise ResumeError("--resume goes on with a real run; a --dry-run has nothing to resume")
    if not outputs.resume.exists():
        if outputs.checkpoint.exists():
            raise ResumeError(f"--resume: {outputs.checkpoint} holds no training state (it was "
                             f"saved before --resume existed, {outputs.resume.name} beside it "
                             "was removed, or it could not be written): start a new run "
                             "without --resume")
        raise ResumeError(f"--resume: there is no run to resume at {outputs.checkpoint}: it "
                         "saved no epoch yet (stopped during its first one: start it again "
                         "without --resume), or it was started with another --save-path (or "
                         "--model or --dataset): give that one")
    if not outputs.resume.is_file():
        raise ResumeError(f"--resume: {outputs.resume} is not a file (a folder?), so it holds no "
                          "training state: move it away, or start a new run without --resume")
    try:
        if part := common.damaged_part(outputs.resume):  # changed after it was saved
            raise ValueError(f"its part {part} does not read back as it was saved")
        state = torch.load(outputs.resume, weights_only=True)  # tensors and plain values only
        settings, done = dict(state["settings"]), int(state["epoch"])
        for key in ("model", "optimizer", "scaler", "scheduler", "rng", "best", "history"):
            state[key]  # all there, or it is a KeyError: damaged, or from another version
        settings.setdefault("schedule", "constant")  # a run saved before --schedule existed
        settings.setdefault("ema", False)  # or before --ema
        ## Edited by hand, or saved by another version of the script: refused here, in one
        ## line, rather than with a traceback an epoch later.
        problem = settings_problem(settings, parser)
        rng, best = state["rng"], state["best"]
        if not (isinstance(rng, torch.Tensor) and rng.dtype == torch.uint8
                and isinstance(state["history"], list) and isinstance(best, (list, tuple))
                and len(best) == 2 and all(isinstance(v, (int, float)) for v in best)):
            problem = problem or "its history, best epoch or random state is not what it saves"
        if settings["ema"] and not isinstance(state["ema"], dict):
            problem = problem or "its --ema running average of the weights is missing"
        if problem:
            raise ValueError(problem)
    except OSError as err:  # a file this user may not read
        raise common.CheckpointError(f"{outputs.resume} cannot be read ({err.strerror or err}), "
                                     "so the run cannot be resumed") from err
    except Exception as err:
        why = (f"it has no {err} part" if isinstance(err, KeyError)
               else common.first_sentence(err))
        raise common.CheckpointError(f"{outputs.resume} is damaged, so the run cannot be "
                                     f"resumed ({why}): start a new run without --resume") \
            from err
    check_best_model(outputs, state, settings["model"])
    for name, value in settings.items():
        if name not in given:  # left out: the run's own setting
            setattr(args, name, value)
        elif getattr(args, name) != value and name != "epochs":  # more epochs: see below
            flag = "--" + name.replace("_", "-")
            raise ResumeError(f"--resume: this run was started {with_flag(flag, value)}, not "
                             f"{with_flag(flag, getattr(args, name))}; leave {flag} out to go "
                             "on with it, or start a new run")
    state["epoch"] = done
    ## A schedule's learning rate was planned over the run's epochs: it cannot be stretched.
    if settings["schedule"] != "constant" and args.epochs != settings["epochs"]:
        raise ResumeError(f"--resume: this run's {settings['schedule']} learning rate was planned "
                          f"over {settings['epochs']} epochs, so it cannot go on to "
                          f"{args.epochs}; leave --epochs out, or start a new run")
    if args.schedule != "constant" and done >= args.epochs:
        raise ResumeError(f"--resume: this run has trained all its {done} epochs, and its "
                          f"{args.schedule} learning rate has come down to 0: to train more, "
                          "start a new run")
    if args.epochs <= done:
        raise ResumeError(f"--resume: this run has trained {done} epochs already"
                          + (f", all {done} of its --epochs" if args.epochs == done else "")
                          + f"; pass --epochs with more than {done} to go on")
    outputs.state = state
    outputs.last_epoch = done  # its training state is on disk
    outputs.saved = tuple(state["best"])[::-1]  # (epoch, val acc) of this run's best so far
    if common.is_main_process():
        print(f"resuming {outputs.checkpoint}: epochs {state['epoch'] + 1} to {args.epochs}")


def check_best_model(outputs: RunOutputs, state: dict, model_name: str) -> None:
    """Refuse to resume if the best model beside the training state is not the run's own."""
    ## A model copied to this path since (to try it with predict.py) would be tested at the
    ## end as if it were this run's, and replaced by the run's next best without being kept.
    best_acc, best_epoch = state["best"]
    try:
        best = common.load_checkpoint(outputs.checkpoint)
    except common.CheckpointError as err:
        raise common.CheckpointError(
            f"--resume: the run's best model cannot be read ({common.first_sentence(err)}), so "
            f"the run cannot be resumed: put its {outputs.checkpoint.name} back, or start a new "
            "run without --resume") from None
    held = (best.get("model_name"), best.get("epoch"), best.get("val_accuracy"))
    if held != (model_name, best_epoch, best_acc):
        what = (f"{held[0]} epoch {held[1]}, val acc {held[2]:.4f}"
                if isinstance(held[2], float) else f"a {held[0]} model")
        raise common.CheckpointError(
            f"--resume: {outputs.checkpoint} is not the best model of the run that "
            f"{outputs.resume.name} goes on with (that was {model_name} epoch {best_epoch}, val "
            f"acc {best_acc:.4f}; the file holds {what}): it was replaced after that run, so "
            "the run cannot be resumed. Put that run's model back, or start a new run without "
            "--resume, which keeps both files under a dated name")


def with_flag(flag: str, value) -> str:
    """A setting as the command line gives it: 'with --lr 0.01', 'with --ema', 'without --ema'."""
    if value is None or value is False:  # not given
        return "without " + flag
    return f"with {flag}" + ("" if value is True else f" {as_flag(value)}")


def as_flag(value) -> str:
    """A setting's value as it is typed on the command line: [128, 64] as 128 64."""
    return " ".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


def settings_problem(settings: dict, parser: argparse.ArgumentParser) -> str | None:
    """What a saved run's settings hold that this script's command line would refuse, or None:
    a state edited by hand, or saved by another version of the script."""
    for action in parser._actions:
        name = action.dest
        if name not in RUN_SETTINGS:
            continue
        if name not in settings:
            return f"it has no setting {name}"
        value, ok = settings[name], True
        if action.nargs == 0:  # a flag such as --augment: True or False
            ok = isinstance(value, bool)
        elif value is not None or action.default is not None:  # None: "not given", if allowed
            for item in value if isinstance(value, list) else [value]:
                try:  # what the command line would make of it, typed as it was saved
                    parsed = action.type(str(item)) if action.type else item
                except (argparse.ArgumentTypeError, ValueError, TypeError):
                    ok = False
                    break
                ok = ok and parsed == item and (not action.choices or item in action.choices)
        if not ok:
            return f"its setting {name} is {value!r}, which {action.option_strings[0]} refuses"
    return None


def given_on_command_line(parser: argparse.ArgumentParser, argv: list[str] | None) -> set[str]:
    """The settings (dest names) that the command line sets, whatever their values."""
    argv = sys.argv[1:] if argv is None else argv
    return {action.dest for action in parser._actions for option in action.option_strings
            if any(arg == option or arg.startswith(option + "=") for arg in argv)}


def resume_training(state: dict, model: nn.Module, optimizer: torch.optim.Optimizer,
                    scaler: torch.amp.GradScaler | None, scheduler, averaged: nn.Module | None,
                    world: int):
    """Put the saved training state back; return (best acc, best epoch, history, next epoch)."""
    try:
        model.load_state_dict(state["model"])  # the last epoch's weights, not the best ones
        optimizer.load_state_dict(state["optimizer"])  # Adam's running averages and step count
        if averaged is not None:  # --ema: the running average of the weights
            averaged.load_state_dict(state["ema"])
    except (RuntimeError, ValueError, KeyError) as err:  # the state of another model's run
        raise common.CheckpointError("--resume: the training state saved beside the checkpoint "
                                     "(its _resume.pt) does not fit the model its settings "
                                     f"describe ({common.first_detail(err)}), so the run "
                                     "cannot be resumed: start a new run without --resume"
                                     ) from None
    if scaler is not None and state["scaler"] is not None:
        scaler.load_state_dict(state["scaler"])
    if scheduler is not None:  # where the learning rate schedule had got to
        scheduler.load_state_dict(state["scheduler"])
    ## The CPU's random numbers (dropout, --augment), as if never interrupted; a GPU's own
    ## generator is not saved. Under torchrun each rank draws its own numbers and only rank 0's
    ## were saved: putting those back on every rank would give them all the same ones.
    if world == 1:
        torch.set_rng_state(state["rng"])
    best_acc, best_epoch = state["best"]
    return best_acc, best_epoch, state["history"], state["epoch"] + 1


## Where and how a run runs, rather than what it trains: the data folder, the device, the logs.
## These are not saved with the run, so the command that goes on with it repeats them.
HOW_IT_RUNS = ("data_dir", "device", "num_workers", "test_batch_size", "log_interval",
               "tensorboard", "compile", "deterministic")


def resume_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> str:
    """The command that goes on with this run: the flags that name its files, the flags of
    HOW_IT_RUNS that differ from their defaults, and --resume."""
    flags = [f"--save-path {shell_word(args.save_path)}"] if args.save_path else []
    flags += [f"--model {args.model}"] if args.model != "mlp" and not args.save_path else []
    flags += ([f"--dataset {args.dataset}"] if args.dataset != "mnist" and not args.save_path
              else [])
    for name in HOW_IT_RUNS:
        value, flag = getattr(args, name), "--" + name.replace("_", "-")
        if value != parser.get_default(name):
            flags.append(flag if value is True else f"{flag} {shell_word(value)}")
    start, world = "python", int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:  # under torchrun: as many processes again
        start = (f"torchrun --standalone --nproc_per_node={world}"
                 if os.environ.get("LOCAL_WORLD_SIZE") == str(world)  # all on this machine
                 else "torchrun <this run's torchrun options>")  # several machines
    return " ".join([start, "mnist_train.py", *flags, "--resume"])


def shell_word(value) -> str:
    """`value` as one word of a command line, quoted if it needs it (a space in a path)."""
    text = str(value)
    return subprocess.list2cmdline([text]) if os.name == "nt" else shlex.quote(text)


def was_dry_run(path: Path) -> bool:
    """Whether the checkpoint at `path` was written by a --dry-run (False if there is none)."""
    if not path.exists():
        return False  # a real run's CSV or training state may still be there: they are kept
    try:
        return bool(common.load_checkpoint(path).get("dry_run"))
    except common.CheckpointError:
        return False  # a damaged file, or someone else's: kept, like a real checkpoint


def describe_checkpoint(path: Path) -> str:
    """' (epoch 4, val acc 0.9718)' for a checkpoint of this repo, else ''."""
    try:
        checkpoint = common.load_checkpoint(path)
        return f" (epoch {checkpoint['epoch']}, val acc {checkpoint['val_accuracy']:.4f})"
    except (common.CheckpointError, KeyError, TypeError, ValueError):
        return ""


def mistakes_path(save_path: Path) -> Path:
    """checkpoints/mnist_mlp.pt -> checkpoints/mnist_mlp_mistakes.png"""
    return save_path.with_name(f"{save_path.stem}_mistakes.png")
