"""Score checkpoints on a folder of real pictures of digits, labelled by their file names.

    python benchmarks/real_pictures.py --images my_digits \
        --checkpoint checkpoints/mnist_mlp.pt checkpoints/mnist_cnn.pt

    git worktree add ../old eb7006e   # an older version beside this one, to compare both:
    python benchmarks/real_pictures.py --images DIR --compare-with ../old/predict.py
    python benchmarks/real_pictures.py --images DIR --speed-only --compare-with ../old/predict.py
    python benchmarks/real_pictures.py --images DIR --speed-only --load   # timing under load

Every picture goes through what predict.py runs for a digit model (digit_cleanup.load_gray,
then digit_cleanup.preprocess, then predict.classify). A picture's label is the digit its file name
starts with (`7.png`, `7_12.jpg`, `7-mine.png`). When the folder has a SOURCES.md with a
Markdown table of `| file | label | kind | repo | ...` rows, the accuracy is also given per kind
(drawing, photo, scan). Files with a picture's extension (.png, .jpg, ... : PICTURE_SUFFIXES)
are read by their content, so a JPEG named .png is read right; other files are left out.

It prints, for each checkpoint, the accuracy overall, per kind and per digit, its misreadings
counted by pair (6 -> 5: 4 says four 6s were read as 5, a systematic miss), the median ink of
the 28x28 inputs, the pictures that got a warning (a real single digit should get none), and the
time that reading and clean-up took per picture (median, 90th percentile, slowest). A sheet of
the misses, each picture beside the 28x28 image the model saw and captioned with the model that
misread it, goes to --misses (real_misses.png unless told otherwise; '' for none).

--compare-with scores the same checkpoints with another version's clean-up as well (a
digit_cleanup.py, or the predict.py of a version from before the clean-up had a module of its
own), and lists, per source repository of SOURCES.md, how many pictures each version reads
right, whether the source is won, lost or even, and every picture that flipped. With
--speed-only it times the two instead, alternated picture by picture, so that a busy moment of
the machine hits both alike; --load runs a second process with the same clean-up loop during
the timing, to show how the clean-up behaves on a busy machine.

Pictures that are not yours stay out of the repository: write --misses outside it, or to the
default name, which .gitignore leaves out.
"""

import argparse
import collections
import importlib.util
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from PIL import Image, ImageDraw, ImageFont, ImageOps

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
import predict
from plumbing import digit_cleanup, files, runs

PICTURE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff"}


def labelled_pictures(folder: Path) -> list[tuple[Path, int]]:
    """(path, label) for every picture in `folder` whose name starts with a digit."""
    found = []
    for path in sorted(folder.iterdir(), key=lambda p: natural_key(p.name)):
        match = re.match(r"(\d)(?:[_\-. ]|$)", path.stem + " ")
        if path.suffix.lower() in PICTURE_SUFFIXES and match:
            found.append((path, int(match.group(1))))
    return found


def natural_key(name: str) -> list:
    """Sort 1_2.png before 1_10.png."""
    ## [0-9], not \d: \d also matches digits such as "²", which int() refuses.
    return [(0, int(part)) if part.isdigit() and part.isascii() else (1, part)
            for part in re.split(r"([0-9]+)", name)]


def sources_of(folder: Path) -> dict[str, tuple[str, str]]:
    """{file name: (kind, source repository)} from SOURCES.md's table, or {} when there is none.

    The table's rows read `| file | label | kind | repo | ...`."""
    sources = folder / "SOURCES.md"
    if not sources.exists():
        return {}
    found = {}
    for line in sources.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[1].isdigit():
            found[cells[0]] = (cells[2], cells[3] if len(cells) > 3 else "")
    return found


def clean_up(path: Path, cleanup=digit_cleanup) -> tuple[torch.Tensor | None, str | None, float]:
    """predict.py's reading and clean-up of one picture: (digit, warning, seconds). `cleanup`:
    the module that does it, this version's digit_cleanup or another's (load_other)."""
    start = time.perf_counter()
    try:
        digit, warning = cleanup.preprocess(cleanup.load_gray(path))
    except cleanup.ImageProblem as err:
        return None, f"unreadable: {err}", time.perf_counter() - start
    return digit, warning, time.perf_counter() - start


def speed_report(seconds: list[float]) -> str:
    ms = sorted(s * 1000 for s in seconds)
    p90 = ms[min(len(ms) - 1, round(0.9 * (len(ms) - 1)))]
    return (f"reading and clean-up per picture: median {statistics.median(ms):.0f} ms, "
            f"90th percentile {p90:.0f} ms, slowest {ms[-1]:.0f} ms ({len(ms)} pictures)")


def pictures_in(folder: Path) -> list[tuple[Path, int]]:
    """labelled_pictures(folder), or exit with one line when there are none."""
    if not folder.is_dir():
        sys.exit(f"error: --images {folder}: not a folder (give the folder of pictures)")
    pictures = labelled_pictures(folder)
    if not pictures:
        sys.exit(f"error: no pictures named <digit>_... ({', '.join(sorted(PICTURE_SUFFIXES))}) "
                 f"in {folder}/")
    return pictures


def score(args) -> None:
    folder = Path(args.images)
    pictures = pictures_in(folder)
    sources = sources_of(folder)
    try:
        models = [(Path(c).stem, *files.load_model(c)) for c in args.checkpoint]
    except files.CheckpointError as err:
        sys.exit(f"error: {str(err).rstrip('.')}. Train one with mnist_train.py, or pass "
                 "--checkpoint")
    ## Each model reads each picture as cleaned up by this version, and by the other one when
    ## --compare-with names it: a "reader" is a model and a version, "mnist_mlp" or
    ## "mnist_mlp with ../old/digit_cleanup.py".
    versions = [("", digit_cleanup)]
    if args.compare_with:
        versions.append((f" with {args.compare_with}", other_cleanup(args.compare_with)))
    rows, seconds, warned = [], [], []
    for path, label in pictures:
        kind, source = sources.get(path.name, ("other", ""))
        row = {"path": path, "label": label, "kind": kind, "source": source, "seen": {},
               "guesses": {}, "ink": {}}
        for version, cleanup in versions:
            digit, warning, took = clean_up(path, cleanup)
            if not version:
                seconds.append(took)
            if warning:
                warned.append(f"{path.name}{version}: {warning}")
            row["ink"][version] = None if digit is None else float(digit.mean())
            for name, model, checkpoint in models:
                row["seen"][name + version] = digit
                row["guesses"][name + version] = -1 if digit is None else int(predict.classify(
                    model, digit, checkpoint["mean"], checkpoint["std"], torch.device("cpu")
                ).argmax())
        rows.append(row)

    readers = [name + version for name, _, _ in models for version, _ in versions]
    print(f"{len(rows)} pictures in {folder}/")
    by_kind = sorted({r["kind"] for r in rows}) if sources else []  # no SOURCES.md: "all" only
    print("| model | all | " + "".join(f"{kind} | " for kind in by_kind))
    print("|---|---|" + "---|" * len(by_kind))
    def share(subset, name):  # (right, pictures)
        return sum(r["guesses"][name] == r["label"] for r in subset), len(subset)

    for name in readers:
        right, total = share(rows, name)
        cells = [f"{right / total:.1%} ({right}/{total})"]
        for kind in by_kind:
            k_right, k_total = share([r for r in rows if r["kind"] == kind], name)
            cells.append(f"{k_right}/{k_total}")
        print(f"| {name} | " + " | ".join(cells) + " |")
    print("\nper digit (right / pictures):")
    print("| model | " + " | ".join(str(d) for d in range(10)) + " |")
    print("|---|" + "---|" * 10)
    for name in readers:
        cells = []
        for d in range(10):
            subset = [r for r in rows if r["label"] == d]
            cells.append(f"{sum(r['guesses'][name] == d for r in subset)}/{len(subset)}")
        print(f"| {name} | " + " | ".join(cells) + " |")
    print("\nmisreadings, the most frequent first (true -> read: pictures; -1: unreadable):")
    print("| model | misreadings |")
    print("|---|---|")
    for name in readers:
        pairs = collections.Counter((r["label"], r["guesses"][name]) for r in rows
                                    if r["guesses"][name] != r["label"])
        cells = [f"{true} -> {read}: {count}" for (true, read), count in pairs.most_common()]
        print(f"| {name} | {', '.join(cells) or 'none'} |")
    ## MNIST's digits have a median ink of 0.129 (mean pixel of its 10,000 test digits): a
    ## clean-up that draws as MNIST does comes out near it.
    for version, _ in versions:
        inks = [r["ink"][version] for r in rows if r["ink"][version] is not None]
        if inks:
            print(f"\nmedian ink of the 28x28 inputs{version} (mean pixel, 0..1): "
                  f"{statistics.median(inks):.3f}", end="")
    print(f"\n\npictures with a warning: {len(warned)}")
    for line in warned:  # say(): a file name the terminal cannot show becomes an escape
        runs.say(f"  {line}", sys.stdout)
    print(speed_report(seconds))
    if args.compare_with:
        for name, _, _ in models:
            source_by_source(rows, name, name + versions[1][0])
    misses = [(r, name) for r in rows for name in readers if r["guesses"][name] != r["label"]]
    if args.errors:
        for r, name in misses:
            runs.say(f"{name}: {r['path'].name} ({r['kind']}) is {r['label']}, read as "
                        f"{r['guesses'][name]}", sys.stdout)
    if args.misses and misses:
        draw_misses(misses, Path(args.misses))
        print(f"wrote {args.misses}: {len(misses)} misses, each beside what the model saw")


def source_by_source(rows: list[dict], mine: str, theirs: str) -> None:
    """Print, per source repository, how many pictures `mine` reads right and `theirs` does,
    whether the source is won, lost or even, and the pictures whose verdict flipped."""
    ## A total can hide a change that helps one collection and hurts several others: a rule
    ## worth keeping wins more sources than it loses.
    print(f"\n{mine} against {theirs}: pictures read right, source by source")
    print("| source | pictures | here | there | net |")
    print("|---|---|---|---|---|")
    by_source = {}
    for r in rows:
        by_source.setdefault(r["source"] or "(none named)", []).append(r)
    nets = []
    for source, subset in sorted(by_source.items(), key=lambda item: item[0].lower()):
        here = sum(r["guesses"][mine] == r["label"] for r in subset)
        there = sum(r["guesses"][theirs] == r["label"] for r in subset)
        nets.append(here - there)
        runs.say(f"| {source} | {len(subset)} | {here} | {there} | {here - there:+d} |",
                   sys.stdout)
    print(f"sources: {sum(n > 0 for n in nets)} won, {sum(n < 0 for n in nets)} lost, "
          f"{sum(n == 0 for n in nets)} even")
    flipped = [r for r in rows
               if (r["guesses"][mine] == r["label"]) != (r["guesses"][theirs] == r["label"])]
    won = sum(r["guesses"][mine] == r["label"] for r in flipped)
    print(f"pictures that flipped: {won} won, {len(flipped) - won} lost")
    for r in flipped:
        runs.say(f"  {'won ' if r['guesses'][mine] == r['label'] else 'lost'} "
                   f"{r['path'].name} ({r['kind']}, {r['source'] or 'no source'}): "
                   f"{r['label']} read as {r['guesses'][mine]} here, {r['guesses'][theirs]} "
                   "there", sys.stdout)


def draw_misses(misses: list, out: Path, columns: int = 6) -> None:
    """A sheet of misreads: each picture as it is, beside the 28x28 input, captioned."""
    font = ImageFont.load_default(size=12)
    tiles = []
    for r, name in misses:
        tile = Image.new("RGB", (232, 134), (255, 255, 255))
        if r["seen"][name] is None:  # the picture could not be read: a gray square in its place
            tile.paste((128, 128, 128), (2, 2, 114, 114))
        else:
            with Image.open(r["path"]) as img:
                tile.paste(ImageOps.pad(img.convert("RGB"), (112, 112), color=(128, 128, 128)),
                           (2, 2))
            pixels = (r["seen"][name] * 255).round().to(torch.uint8)
            seen = Image.frombytes("L", (28, 28), bytes(pixels.flatten().tolist()))
            tile.paste(seen.resize((112, 112), Image.NEAREST).convert("RGB"), (118, 2))
        caption = f"{r['path'].name}: {r['label']} as {r['guesses'][name]} ({name})"
        ImageDraw.Draw(tile).text((4, 116), caption[:38], fill=(0, 0, 0), font=font)
        tiles.append(tile)
    rows = (len(tiles) + columns - 1) // columns
    sheet = Image.new("RGB", (columns * 236 + 4, rows * 138 + 4), (200, 200, 200))
    for i, tile in enumerate(tiles):
        sheet.paste(tile, (4 + (i % columns) * 236, 4 + (i // columns) * 138))
    out.parent.mkdir(parents=True, exist_ok=True)
    sheet.save(out)


LOAD_LOOP = """
import sys, time
sys.path.insert(0, sys.argv[1])
from plumbing import digit_cleanup
from pathlib import Path
paths = sys.argv[2:]
end = time.time() + 600
while time.time() < end:  # stopped by the parent when its timing is over
    for p in paths:
        try:
            digit_cleanup.preprocess(digit_cleanup.load_gray(Path(p)))
        except digit_cleanup.ImageProblem:
            pass
"""


def other_cleanup(file: str):
    """Another version's clean-up (a digit_cleanup.py, or an older predict.py), loaded beside
    this one with its own common.py; or exit with one line when there is no such file."""
    path = Path(file)
    if not path.is_file():
        sys.exit(f"error: --compare-with {file}: no such file")
    def its_own(name: str) -> bool:  # the modules its imports must find in its own folder
        return name in ("common", "digit_cleanup", "plumbing") or name.startswith("plumbing.")

    ours = {name: sys.modules.pop(name) for name in list(sys.modules) if its_own(name)}
    folder = path.resolve().parent  # the folder of its common.py: above plumbing/, if in it
    sys.path.insert(0, str(folder.parent if folder.name == "plumbing" else folder))
    try:
        spec = importlib.util.spec_from_file_location("other_cleanup", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.pop(0)
        for name in [name for name in sys.modules if its_own(name)]:
            sys.modules.pop(name)
        sys.modules.update(ours)
    return module


def speed_only(args) -> None:
    """Time the clean-up alone, optionally while a second process runs the same loop."""
    pictures = [p for p, _ in pictures_in(Path(args.images))]
    other = None
    if args.compare_with:
        other = other_cleanup(args.compare_with)
        for p in pictures[:20]:  # warm-up for both, untimed
            clean_up(p)
            clean_up(p, other)
    load = None
    if args.load:
        load = subprocess.Popen([sys.executable, "-c", LOAD_LOOP, str(REPO),
                                 *map(str, pictures)])
        time.sleep(3)  # let it import torch and start its loop
    try:
        for round_ in range(1, args.rounds + 1):
            seconds, theirs = [], []
            for i, p in enumerate(pictures):
                ## With another version: both on each picture, one right after the other, the
                ## order swapped from picture to picture, so that the machine's busy moments
                ## (they last seconds) fall on both alike.
                if other is not None and i % 2:
                    theirs.append(clean_up(p, other)[2])
                seconds.append(clean_up(p)[2])
                if other is not None and not i % 2:
                    theirs.append(clean_up(p, other)[2])
            print(f"round {round_}{' (with a second process)' if load else ''}: "
                  + speed_report(seconds), flush=True)
            if other is not None:
                print(f"  {args.compare_with}: {speed_report(theirs)}\n  this clean-up is "
                      f"{statistics.median(theirs) / statistics.median(seconds):.1f}x as fast "
                      f"at the median, {max(theirs) / max(seconds):.1f}x at the slowest",
                      flush=True)
    finally:
        if load is not None:
            load.kill()
            load.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", required=True, help="a folder of <digit>_*.png/jpg files")
    parser.add_argument("--checkpoint", nargs="+", default=["checkpoints/mnist_mlp.pt"])
    parser.add_argument("--errors", action="store_true", help="list every misread picture")
    parser.add_argument("--misses", default="real_misses.png",
                        help="write a picture of the misses here ('' for none)")
    parser.add_argument("--speed-only", action="store_true",
                        help="only time the clean-up (no model), --rounds times")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--load", action="store_true",
                        help="with --speed-only: run the same loop in a second process")
    parser.add_argument("--compare-with", metavar="FILE",
                        help="another version's digit_cleanup.py (or older predict.py): score "
                             "the same checkpoints with it too, source by source; with "
                             "--speed-only, time both, alternated picture by picture")
    args = parser.parse_args()
    if args.load and not args.speed_only:
        parser.error("--load times the clean-up under load: add --speed-only")
    speed_only(args) if args.speed_only else score(args)


if __name__ == "__main__":
    main()
