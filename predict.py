"""Classify your own pictures of handwritten digits with the model mnist_train.py saved.

    python mnist_train.py --epochs 5                  # once: writes checkpoints/mnist_mlp.pt
    python predict.py samples/photo_3.jpg             # a sample picture that comes with the repo
    python predict.py photos/*.jpg --top-k 3          # also the runner-up guesses
    python predict.py my_digit.png --model cnn        # mnist_train.py --model cnn's checkpoint
    python predict.py my_digit.png --json             # machine-readable output
    python predict.py my_digit.png --save-input seen  # writes seen/my_digit.png, what the model saw
    python predict.py --serve                         # a page to draw on: http://127.0.0.1:8000/

What you should see: first which model answers, then one line per picture (a couple of
seconds in all, most of it `import torch`; each picture takes milliseconds):

    checkpoints/mnist_mlp.pt: mlp 784-128-64-10, epoch 4, val acc 0.9718
    samples/photo_3.jpg: 3 (100.0%)

(epoch 4: the checkpoint holds the epoch with the best validation accuracy, not the last one.)

A model only knows the kind of images it was trained on: MNIST digits are white on black,
about 20x20 pixels inside a 28x28 frame, centred by their centre of mass. A phone photo of a
digit is none of that, so each picture first goes through digit_cleanup.py, which turns any
picture into such an image (or warns when it holds no digit, or several). classify() then
normalises the image exactly as training did (the mean and std come from the checkpoint) and
runs the model. Those two steps, read_and_classify() and classify(), are the lesson to copy;
main() around them is the command line. One picture that cannot be read never stops the others.
"""

import argparse
import gc
import glob
import io
import json
import os
import signal
import sys
import traceback
from pathlib import Path

## Speed only (skip these gc lines on a first read): the cycle collector is paused while torch
## loads, and torch's objects are then frozen out of its sight (see mnist_train.py).
if __name__ == "__main__":
    gc.disable()

## Ctrl-C while these load (`import torch` takes a second or two) ends the script with one
## line, as Ctrl-C does later, instead of a traceback from deep inside torch.
try:
    import torch
    from PIL import Image

    import common
    import digit_cleanup
    from digit_cleanup import ImageProblem
except KeyboardInterrupt:
    if __name__ != "__main__":  # imported (a notebook, the tests): the importer handles it
        raise
    print("\ninterrupted: stopped while starting up.", file=sys.stderr)
    sys.exit(130)
finally:
    if __name__ == "__main__":  # speed only (see above): freeze what loaded, collector on
        gc.freeze()
        gc.enable()


# classifying: the main path ------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.images and not args.serve:
        parser.error("give one or more pictures to classify, or --serve to draw on a page")
    if args.serve and args.images:  # the page takes its pictures from the browser
        parser.error("--serve takes no pictures: classify them without --serve, or drop them "
                     "on the page")
    if args.serve and (args.json or args.save_input or args.top_k != 1):  # the page shows those
        parser.error("--json, --save-input and --top-k are for pictures on the command line; "
                     "the page shows every class's probability and the 28x28 input itself")
    if args.checkpoint is not None and args.model is not None:
        parser.error("give --model (for its default checkpoint) or --checkpoint, not both")
    given = args.checkpoint is not None  # if not, the error for a missing one says where it is
    if not given:  # where `mnist_train.py --model M` saves (for MNIST; others need --checkpoint)
        args.checkpoint = Path("checkpoints") / f"mnist_{args.model or 'mlp'}.pt"
    try:
        device = common.get_device(args.device)
    except ValueError as err:
        parser.error(str(err))
    ## The model, rebuilt and in eval mode, and the checkpoint: the dict that
    ## common.save_checkpoint wrote, with the architecture ("model_name", "sizes"), the weights
    ## ("state_dict"), the normalisation used in training ("mean", "std"), the best "epoch"
    ## and its "val_accuracy", and the "dataset" and its "classes".
    try:
        model, checkpoint = common.load_model(args.checkpoint, device)
    except common.CheckpointError as err:
        print(f"error: {checkpoint_problem(err, args, given)}", file=sys.stderr)
        return 1
    ## Checked (and created) only now: a run that stops at the checkpoint leaves no new folder.
    if args.save_input is not None and (problem := common.check_output_dir(args.save_input)):
        parser.error(f"--save-input {args.save_input}: {problem}")
    if checkpoint.get("dataset", "mnist") != "mnist":
        print(f"note: {args.checkpoint} was trained on {checkpoint['dataset']}, not on "
              "handwritten digits, so each picture is only scaled to 28x28 gray (and inverted "
              "when its background is light), without the digit clean-up", file=sys.stderr)

    ## Speed only: the model and checkpoint live as long as this process, like the objects of
    ## `import torch` frozen above. Leaving them out of Python's later garbage collections
    ## (see mnist_train.py) saves time at each collection and at exit.
    gc.freeze()
    if args.serve:  # the page: each picture it sends goes through read_and_classify, as below
        import digit_server
        about = {"checkpoint": str(args.checkpoint), "model": checkpoint["model_name"],
                 "epoch": checkpoint.get("epoch"), "val_accuracy": checkpoint.get("val_accuracy"),
                 "classes": class_names(checkpoint)}
        return digit_server.run(args.host, args.port, page_answer(model, checkpoint, device),
                                about, args.debug)

    if not args.json:  # which model answers: each training run replaces the default one
        common.say(f"{args.checkpoint}: {describe(checkpoint)}", sys.stdout)
    results, failed, paths = [], 0, expand_patterns(args.images)  # *.jpg, where no shell did
    ## Names --save-input must not use: DIR/<name>.png never replaces a picture being
    ## classified that is itself in DIR (unique_stem then picks <name>-2.png).
    taken = {p.stem.casefold() for p in paths if args.save_input is not None
             and p.suffix.lower() == ".png" and same_folder(p.parent, args.save_input)}
    for path in paths:
        try:
            if path.suffix.lower() in (".pt", ".pth") and path.is_file():
                raise ImageProblem(f"is a checkpoint, not a picture: did you mean --checkpoint "
                                   f"{path}?")
            result, digit, probs = read_and_classify(path, model, checkpoint, device)
        except ImageProblem as err:  # a file that is not a readable picture
            common.say(f"{path}: error: {err}", sys.stderr)
            results.append({"path": str(path), "error": str(err)})  # --json lists it too
            failed += 1
            continue
        except Exception as err:  # a bug here: say so, and go on with the other pictures
            if args.debug:
                traceback.print_exc()
            common.say(f"{path}: error: unexpected {type(err).__name__}: "
                       f"{common.first_line(err)}. This is a bug, not a fault of the picture: "
                       "please report it with the picture (--debug shows the traceback).",
                       sys.stderr)
            results.append({"path": str(path), "error": f"unexpected {type(err).__name__}"})
            failed += 1
            continue
        if result["warning"]:  # "no digit found ...": the guess is about an empty image
            meaning = ("means nothing" if result["warning"].startswith("no digit")
                       else "reads it all as one digit")
            common.say(f"{path}: warning: {result['warning']}; the guess {meaning}", sys.stderr)
        results.append({"path": str(path), **result, "checkpoint": str(args.checkpoint),
                        "model": checkpoint["model_name"]})
        if not args.json:
            top = probs.topk(args.top_k)
            guesses = ", ".join(f"{class_names(checkpoint)[int(i)]} ({p:.1%})"
                                for p, i in zip(top.values, top.indices))
            common.say(f"{path}: {guesses}", sys.stdout)
        if args.save_input is not None:
            try:
                save_input(args.save_input / f"{unique_stem(path, taken)}.png", digit)
            except common.OutputError as err:  # classified, but what it saw cannot be saved
                problem = f"--save-input could not save what the model saw: {err}"
                common.say(f"{path}: error: {problem}", sys.stderr)
                results[-1]["save_input_error"] = problem  # --json tells it too
                failed += 1
    if args.json:
        print(json.dumps(results, indent=2))
    return 1 if failed else 0


def read_and_classify(source, model: torch.nn.Module, checkpoint: dict,
                      device: torch.device) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """Read a picture (a path, or a file object), clean it up and classify it.

    Returns the result ({"prediction", "class", "probabilities", "warning"}), the 28 x 28
    image the model saw, and the probabilities as a tensor. The command line and the page
    both use it.
    """
    gray = digit_cleanup.load_gray(source)  # any picture, as gray 0..1 (0 = black)
    if checkpoint.get("dataset", "mnist") == "mnist":
        digit, warning = digit_cleanup.preprocess(gray)  # -> a 28x28 MNIST-style digit
    else:  # the clean-up knows digits only: other pictures are just made small and light-on-dark
        digit, warning = digit_cleanup.plain_28x28(gray), None
    probs = classify(model, digit, checkpoint["mean"], checkpoint["std"], device)
    best = int(probs.argmax())
    result = {"prediction": best, "class": class_names(checkpoint)[best],
              "probabilities": [round(float(p), 6) for p in probs], "warning": warning}
    return result, digit, probs


def classify(model: torch.nn.Module, digit: torch.Tensor, mean: float, std: float,
             device: torch.device) -> torch.Tensor:
    """The model's probability for each of its classes, given one 28 x 28 image (0..1)."""
    ## Normalise exactly as in training (the checkpoint records the mean and std it used), add
    ## the batch and channel dimensions the model expects, and run it without autograd.
    inputs = ((digit - mean) / std)[None, None].to(device)  # [28, 28] -> [1, 1, 28, 28]
    ## Eval mode: Dropout (the CNN has it) switched off, so the same picture always gets the
    ## same answer. load_model() already set it; this line keeps a copy of this function right
    ## with a model straight from training (call model.train() before training it further).
    model.eval()
    with torch.inference_mode():
        logits = model(inputs)  # [1, 10]: one score per class, for the batch of one
    ## softmax turns scores into probabilities summing to 1; [0] takes the only picture's row,
    ## and .float() gives float32 numbers even from a model run in half precision (.half()).
    return torch.softmax(logits, dim=1)[0].float().cpu()


# what a result says, and about which model -------------------------------------------------
def class_names(checkpoint: dict) -> list[str]:
    """The names of the model's classes: "0" to "9" for digits (older checkpoints say none)."""
    return checkpoint.get("classes") or [str(d) for d in range(10)]


def describe(checkpoint: dict) -> str:
    """'mlp 784-128-64-10, epoch 4, val acc 0.9718' (and the dataset when not MNIST)."""
    sizes = checkpoint.get("sizes") or {}
    if checkpoint["model_name"] == "mlp":  # its layer sizes (common.MLP's defaults if none)
        layers = [784, *sizes.get("hidden", (128, 64)), sizes.get("num_classes", 10)]
        name = "mlp " + "-".join(map(str, layers))
    else:
        name = checkpoint["model_name"]
    data = f" on {checkpoint['dataset']}" if checkpoint.get("dataset", "mnist") != "mnist" else ""
    accuracy = checkpoint.get("val_accuracy")  # a number, unless the checkpoint was made by hand
    accuracy = f"{accuracy:.4f}" if isinstance(accuracy, (int, float)) else "?"
    return f"{name}{data}, epoch {checkpoint.get('epoch', '?')}, val acc {accuracy}"


def checkpoint_problem(err: common.CheckpointError, args: argparse.Namespace, given: bool) -> str:
    """The one-line error for a checkpoint that cannot be used, with the next step."""
    text = common.sentence(str(err))
    try:
        missing = not args.checkpoint.exists()
    except OSError:  # a name too long to look up: the error says so
        missing = False
    if missing:
        if given:  # train one that is saved there
            text += (f" Train one first: python mnist_train.py --save-path {args.checkpoint} "
                     "(with --model cnn for a CNN)")
        else:  # the default path: say where that is, whatever the current folder
            text = common.sentence(f"checkpoint {args.checkpoint.resolve()} does not exist")
            model = f" --model {args.model}" if args.model and args.model != "mlp" else ""
            text += f" Train one first: python mnist_train.py{model}"
    return text


# the page: python predict.py --serve -----------------------------------------------------------
def page_answer(model: torch.nn.Module, checkpoint: dict, device: torch.device):
    """The page's answer to the bytes of a picture file: read_and_classify()'s result, and
    the 28 x 28 input the model saw."""
    def answer(picture: bytes) -> dict:
        result, digit, _ = read_and_classify(io.BytesIO(picture), model, checkpoint, device)
        return {**result, "input": (digit * 255).round().to(torch.uint8).tolist()}  # 28 x 28

    return answer


# the command line, and saving what the model saw ---------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    ## common.ArgumentParser: a mistyped flag gets "did you mean"; allow_abbrev=False: and is
    ## never taken silently for a longer one (--top for --top-k).
    parser = common.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False,
                                   formatter_class=common.HelpFormatter)
    parser.add_argument("images", nargs="*", type=Path, help="image files (PNG, JPEG, ...)")
    parser.add_argument("--checkpoint", type=Path, default=None,
                        help="a checkpoint written by mnist_train.py (default: "
                             "checkpoints/mnist_mlp.pt, or that of --model)")
    parser.add_argument("--model", choices=sorted(common.MODELS), default=None,
                        help="use checkpoints/mnist_<model>.pt, where mnist_train.py --model "
                             "<model> saves it")
    parser.add_argument("--top-k", type=common.number_from(1, 10), default=1,
                        help="also show the next K-1 guesses (--json lists every class's "
                             "probability)")
    parser.add_argument("--json", action="store_true", help="print a JSON list instead")
    parser.add_argument("--save-input", type=Path, metavar="DIR", default=None,
                        help="save the 28x28 image the model saw for each input into DIR")
    parser.add_argument("--device", default="cpu", help="cpu is plenty for a few images")
    parser.add_argument("--serve", action="store_true",
                        help="serve a page to draw digits on, at http://HOST:PORT/")
    parser.add_argument("--host", default="127.0.0.1",
                        help="with --serve: 127.0.0.1 is this machine only; 0.0.0.0 shares the "
                             "page with your network")
    parser.add_argument("--port", type=common.number_from(0, 65535), default=8000,
                        help="with --serve (0: any free port)")
    parser.add_argument("--debug", action="store_true",
                        help="show the full traceback when a picture fails unexpectedly")
    return parser


def save_input(path: Path, digit: torch.Tensor) -> None:
    """Save the 28 x 28 image the model saw as a PNG, atomically."""
    pixels = (digit * 255).round().to(torch.uint8)
    buffer = io.BytesIO()
    Image.frombytes("L", (28, 28), bytes(pixels.flatten().tolist())).save(buffer, format="PNG")
    common.write_atomically(path, buffer.getvalue())


def expand_patterns(paths: list[Path]) -> list[Path]:
    """The paths, with patterns such as photos/*.jpg expanded where no shell did it."""
    ## bash and zsh expand *.jpg before Python starts; Windows' cmd and PowerShell pass it on
    ## as it is. A path that does not exist but has a wildcard in it is expanded here.
    found = []
    for path in paths:
        ## os.path.exists, not Path.exists: a name too long to look up is False, not an
        ## OSError, and the code that opens it then says what is wrong with it.
        if not os.path.exists(path) and any(c in str(path) for c in "*?["):
            matches = sorted(Path(p) for p in glob.glob(str(path)))
            found.extend(matches or [path])  # nothing matched: "no such file" says so
        else:
            found.append(path)
    return found


def same_folder(a: str | Path, b: str | Path) -> bool:
    """Whether two paths name one folder (False when either is not there)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def unique_stem(path: Path, used: set[str]) -> str:
    """path's stem, or stem-2, stem-3, ... so that no two files written get one name: pass
    the same `used` set for each, holding the (casefolded) names already taken."""
    ## Compared without case: on Windows and macOS, Seven.png and seven.png are one file.
    stem, n = path.stem, 1
    while (name := stem if n == 1 else f"{stem}-{n}").casefold() in used:
        n += 1
    used.add(name.casefold())
    return name


if __name__ == "__main__":
    if hasattr(signal, "SIGBREAK"):  # Windows: Ctrl-Break (and CTRL_BREAK_EVENT) as Ctrl-C
        signal.signal(signal.SIGBREAK, signal.default_int_handler)
    try:
        code = common.flush_output(main())  # flushed here: `| head` gets no traceback at exit
    except KeyboardInterrupt:  # Ctrl-C: one line, and the exit code a shell expects
        print("\ninterrupted: stopped.", file=sys.stderr)
        sys.exit(130)
    except OSError as err:  # stdout failed: `| head -1` had read enough, or a full disk
        if not common.output_stopped(err):
            raise
        sys.exit(1)
    sys.exit(code)
