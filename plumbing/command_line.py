"""The command lines of the scripts: argparse as people expect it, checked types, and the lines
that name files."""

import argparse
import contextlib
import difflib
import glob
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path


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


def as_words(args: argparse.Namespace, names: tuple[str, ...]) -> list[str]:
    """Settings as command-line words: ['--lr', '0.001', '--augment', '--hidden', '128', '64']."""
    words = []
    for name in names:
        value = getattr(args, name)
        if value is not None and value is not False:
            words += [f"--{name.replace('_', '-')}", *map(str, value if isinstance(value, list)
                                                           else [] if value is True else [value])]
    return words
