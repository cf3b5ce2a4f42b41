"""Classify your own pictures of handwritten digits with the model mnist_train.py saved.

    python mnist_train.py --epochs 5                  # once: writes checkpoints/mnist_mlp.pt
    python predict.py samples/photo_3.jpg             # a picture that comes with the repo
    python predict.py photos/*.jpg --top-k 3          # also the runner-up guesses
    python predict.py my_digit.png --model cnn        # mnist_train.py --model cnn's checkpoint
    python predict.py my_digit.png --json             # machine-readable output
    python predict.py my_digit.png --save-input seen  # seen/my_digit.png: what the model saw
    python predict.py --serve                         # a page to draw on: http://127.0.0.1:8000/

What you should see: which model answers, then one line per picture (a second or two in all,
most of it `import torch`):

    checkpoints/mnist_mlp.pt: mlp 784-128-64-10, epoch 4, val acc 0.9720
    samples/photo_3.jpg: 3 (100.0%)

This is the last day's script of a first week: load the checkpoint, clean up the picture,
classify. A model knows only the kind of pictures it was trained on: MNIST's digits are white
on black, about 20 x 20 pixels inside 28 x 28, centred by their centre of mass. A phone photo is
none of that, so digit_cleanup.py first turns any picture into such a digit (or warns when it
holds none, or several). read_and_classify() and classify() are the part to copy; main() is the
command line, in which one picture that cannot be read never stops the others.
"""

from __future__ import annotations

import glob
import io
import json
import os
import sys
import traceback
from pathlib import Path

import torch
from PIL import Image

import common
import digit_cleanup
import safeguards
from digit_cleanup import ImageProblem


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.images and not args.serve:
        parser.error("give one or more pictures to classify, or --serve to draw on a page")
    if args.serve and (args.images or args.json or args.save_input or args.top_k != 1):
        parser.error("--serve takes no pictures, --json, --save-input or --top-k: drop pictures "
                     "on the page, which shows every class's probability and what the model saw")
    if args.checkpoint and args.model:
        parser.error("give --model (for its default checkpoint) or --checkpoint, not both")
    path = args.checkpoint or Path("checkpoints") / f"mnist_{args.model or 'mlp'}.pt"
    try:
        device = common.get_device(args.device)
    except ValueError as err:
        parser.error(str(err))
    ## 1. The model, rebuilt from its name and sizes and in eval mode, and the checkpoint: the
    ## dict that common.save_checkpoint wrote, with the weights, the normalisation used in
    ## training ("mean", "std"), the best "epoch" and its "val_accuracy", and the "classes".
    try:
        model, checkpoint = common.load_model(path, device)
    except common.CheckpointError as err:
        if os.path.exists(path):
            print(f"error: {err}.", file=sys.stderr)
        else:  # say where it was looked for, and how to make one
            made_by = (f" --save-path {path} (with --model cnn for a CNN)" if args.checkpoint
                       else f" --model {args.model}" if args.model not in (None, "mlp") else "")
            print(f"error: checkpoint {path.resolve()} does not exist. Train one first: python "
                  f"mnist_train.py{made_by}", file=sys.stderr)
        return 1
    if args.save_input and (problem := safeguards.check_output_dir(args.save_input)):
        parser.error(f"--save-input {args.save_input}: {problem}")
    if checkpoint.get("dataset", "mnist") != "mnist":
        print(f"note: {path} was trained on {checkpoint['dataset']}, not on handwritten digits, "
              "so each picture is only scaled to 28x28 gray (and inverted when its background "
              "is light), without the digit clean-up", file=sys.stderr)
    if args.serve:  # the page sends each picture through read_and_classify(), as below
        import digit_server

        about = {"checkpoint": str(path), "model": checkpoint["model_name"],
                 "epoch": checkpoint.get("epoch"), "val_accuracy": checkpoint.get("val_accuracy"),
                 "classes": class_names(checkpoint)}
        return digit_server.run(args.host, args.port, page_answer(model, checkpoint, device),
                                about, args.debug)

    if not args.json:  # which model answers: each training run replaces the default one
        say(f"{path}: {describe(checkpoint, model)}", sys.stdout)
    results, paths = [], expand_patterns(args.images)  # *.jpg, where no shell expanded it
    ## --save-input writes DIR/<name>.png: never over a picture of this batch that is in DIR.
    taken = {p.stem.casefold() for p in paths if p.suffix.lower() == ".png" and args.save_input
             and same_folder(p.parent, args.save_input)}
    for picture in paths:
        ## 2. Clean up and classify; a picture that fails is one line, and the next one goes on.
        try:
            if picture.suffix.lower() in (".pt", ".pth") and picture.is_file():
                raise ImageProblem(f"is a checkpoint, not a picture: did you mean --checkpoint "
                                   f"{picture}?")
            result, digit, probs = read_and_classify(picture, model, checkpoint, device)
        except Exception as err:
            problem = str(err) if isinstance(err, ImageProblem) else (
                f"unexpected {type(err).__name__}: {(str(err).splitlines() or [''])[0]}. This "
                "is a bug, not a fault of the picture: please report it with the picture "
                "(--debug shows the traceback).")
            if args.debug and not isinstance(err, ImageProblem):
                traceback.print_exc()
            say(f"{picture}: error: {problem}", sys.stderr)
            results.append({"path": str(picture), "error": problem})
            continue
        if warning := result["warning"]:  # "no digit found ...": the guess means little
            meaning = "means nothing" if warning.startswith("no digit") else "reads it all as one"
            say(f"{picture}: warning: {warning}; the guess {meaning}", sys.stderr)
        results.append({"path": str(picture), **result, "checkpoint": str(path),
                        "model": checkpoint["model_name"]})
        if not args.json:
            top = probs.topk(args.top_k)
            say(f"{picture}: " + ", ".join(f"{class_names(checkpoint)[i]} ({p:.1%})"
                                           for p, i in zip(top.values, top.indices)), sys.stdout)
        if args.save_input:
            try:
                save_input(args.save_input / f"{unique_stem(picture, taken)}.png", digit)
            except common.OutputError as err:  # classified, but what it saw cannot be saved
                problem = f"--save-input could not save what the model saw: {err}"
                results[-1]["save_input_error"] = problem
                say(f"{picture}: error: {problem}", sys.stderr)
    if args.json:
        print(json.dumps(results, indent=2))
    return 1 if any("error" in r or "save_input_error" in r for r in results) else 0


def read_and_classify(source, model: torch.nn.Module, checkpoint: dict,
                      device: torch.device) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """Read a picture (a path, or a file object), clean it up and classify it: the result
    ({"prediction", "class", "probabilities", "warning"}), the 28 x 28 input the model saw, and
    the probabilities as a tensor. The command line and the page both use it."""
    gray = digit_cleanup.load_gray(source)  # any picture, as gray 0..1 (0 = black)
    if checkpoint.get("dataset", "mnist") == "mnist":
        digit, warning = digit_cleanup.preprocess(gray)  # -> a 28x28 MNIST-style digit
    else:  # the clean-up knows digits only: other pictures are just made small, light on dark
        digit, warning = digit_cleanup.plain_28x28(gray), None
    probs = classify(model, digit, checkpoint["mean"], checkpoint["std"], device)
    best = int(probs.argmax())
    return ({"prediction": best, "class": class_names(checkpoint)[best],
             "probabilities": [round(float(p), 6) for p in probs], "warning": warning},
            digit, probs)


def classify(model: torch.nn.Module, digit: torch.Tensor, mean: float, std: float,
             device: torch.device) -> torch.Tensor:
    """The model's probability for each of its classes, given one 28 x 28 image (0..1)."""
    ## Normalised exactly as in training, with the batch and channel dimensions the model
    ## expects: [28, 28] -> [1, 1, 28, 28].
    inputs = ((digit - mean) / std)[None, None].to(device)
    model.eval()  # Dropout off: the same picture always gets the same answer
    with torch.inference_mode():  # no autograd graph: nothing will call backward()
        logits = model(inputs)  # [1, 10]: one score per class, for the batch of one
    ## softmax turns scores into probabilities that sum to 1; [0] takes the one picture's row.
    return torch.softmax(logits, dim=1)[0].float().cpu()


def class_names(checkpoint: dict) -> list[str]:
    """The names of the model's classes: "0" to "9" for digits (older checkpoints say none)."""
    return checkpoint.get("classes") or [str(d) for d in range(10)]


def describe(checkpoint: dict, model: torch.nn.Module | None = None) -> str:
    """'mlp 784-128-64-10, epoch 4, val acc 0.9718' (and the dataset, when not MNIST)."""
    name = checkpoint["model_name"]
    if isinstance(model, common.MLP):  # its layer sizes, from the layers themselves
        linear = [m for m in model if isinstance(m, torch.nn.Linear)]
        name += " " + "-".join(map(str, [linear[0].in_features, *(m.out_features for m in linear)]))
    data = checkpoint.get("dataset", "mnist")
    accuracy = checkpoint.get("val_accuracy")  # a number, unless the checkpoint was made by hand
    accuracy = f"{accuracy:.4f}" if isinstance(accuracy, (int, float)) else "?"
    return (f"{name}{'' if data == 'mnist' else f' on {data}'}, epoch "
            f"{checkpoint.get('epoch', '?')}, val acc {accuracy}")


def page_answer(model: torch.nn.Module, checkpoint: dict, device: torch.device):
    """The page's answer to the bytes of a picture: read_and_classify()'s result and the 28 x 28
    input the model saw, or {"error": ...} for a file that is no picture."""
    def answer(picture: bytes) -> dict:
        try:
            result, digit, _ = read_and_classify(io.BytesIO(picture), model, checkpoint, device)
        except ImageProblem as err:
            return {"error": f"the picture {err}"}
        return {**result, "input": (digit * 255).round().to(torch.uint8).tolist()}

    return answer


def build_parser() -> safeguards.ArgumentParser:
    parser = safeguards.ArgumentParser(description=__doc__.split("\n")[0])
    add = parser.add_argument
    add("images", nargs="*", type=Path, help="picture files (PNG, JPEG, ...)")
    add("--checkpoint", type=Path, help="a checkpoint written by mnist_train.py (default: "
        "checkpoints/mnist_mlp.pt, or that of --model)")
    add("--model", choices=sorted(common.MODELS),
        help="use checkpoints/mnist_<model>.pt, where mnist_train.py --model <model> saves it")
    add("--top-k", type=safeguards.number_from(1, 10), default=1,
        help="also show the next K-1 guesses (--json lists every class's probability)")
    add("--json", action="store_true", help="print a JSON list instead")
    add("--save-input", type=Path, metavar="DIR",
        help="save the 28x28 image the model saw for each picture into DIR")
    add("--device", default="cpu", help="cpu is plenty for a few pictures")
    add("--serve", action="store_true", help="serve a page to draw digits on, at http://HOST:PORT/")
    add("--host", default="127.0.0.1", help="with --serve: 127.0.0.1 is this machine only; "
        "0.0.0.0 shares the page with your network")
    add("--port", type=safeguards.number_from(0, 65535), default=8000,
        help="with --serve (0: any free port)")
    add("--debug", action="store_true", help="show the traceback of an unexpected error")
    return parser


def say(line: str, stream) -> None:
    """Print a line whose file names may hold control characters: they show as \\n or \\x1b, as
    `ls` shows them, so one name never prints as two lines or recolours the terminal."""
    if stream is sys.stderr and sys.stdout is not None:
        sys.stdout.flush()  # `> log.txt 2>&1`: the lines in the order they were said
    print("".join(c if c.isprintable() or c == "\t" else repr(c)[1:-1] for c in line),
          file=stream)


def save_input(path: Path, digit: torch.Tensor) -> None:
    """Save the 28 x 28 image the model saw as a PNG, whole."""
    buffer = io.BytesIO()
    pixels = bytes((digit * 255).round().to(torch.uint8).flatten().tolist())
    Image.frombytes("L", (28, 28), pixels).save(buffer, format="PNG")
    common.write_atomically(path, buffer.getvalue())


def expand_patterns(paths: list[Path]) -> list[Path]:
    """The paths, with patterns such as photos/*.jpg expanded where no shell did it: bash and
    zsh expand them before Python starts, Windows' cmd and PowerShell do not."""
    found = []
    for path in paths:
        if not os.path.exists(path) and any(c in str(path) for c in "*?["):
            found.extend(sorted(map(Path, glob.glob(str(path)))) or [path])  # none: "no such file"
        else:
            found.append(path)
    return found


def same_folder(a: Path, b: Path) -> bool:
    """Whether two paths name one folder (False when either is not there)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def unique_stem(path: Path, used: set[str]) -> str:
    """path's stem, or stem-2, stem-3, ...: no two files written get one name, compared without
    case as Windows and macOS compare them. `used` holds the names taken, casefolded."""
    stem, n = path.stem, 1
    while (name := stem if n == 1 else f"{stem}-{n}").casefold() in used:
        n += 1
    used.add(name.casefold())
    return name


if __name__ == "__main__":
    safeguards.run_script(main)
