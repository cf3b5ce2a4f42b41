"""Classify your own pictures of handwritten digits with the model mnist_train.py saved.

    python mnist_train.py --epochs 5                  # once: writes checkpoints/mnist_mlp.pt
    python predict.py my_digit.png                    # my_digit.png: 7 (98.6%)
    python predict.py photos/*.jpg --top-k 3          # also the runner-up guesses
    python predict.py my_digit.png --json             # machine-readable output
    python predict.py my_digit.png --save-input seen  # writes seen/my_digit.png, what the model saw

A model only knows the kind of images it was trained on: MNIST digits are white on black,
about 20x20 pixels inside a 28x28 frame, centred by their centre of mass. A phone photo of a
digit is none of that, so each picture first goes through digit_cleanup.py, which turns any
picture into such an image (or warns that it holds no digit). classify() then normalises the
image exactly as training did (the mean and std come from the checkpoint) and runs the model.
One picture that cannot be read never stops the others.
"""

import argparse
import io
import json
import sys
import traceback
from pathlib import Path

import torch
from PIL import Image

import common
import digit_cleanup
from digit_cleanup import ImageProblem


# classifying: the main path ------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        device = common.get_device(args.device)
    except ValueError as err:
        parser.error(str(err))
    if args.save_input is not None and (problem := common.check_output_dir(args.save_input)):
        parser.error(f"--save-input {args.save_input}: {problem}")
    try:  # the architecture's name, the weights, and the normalisation used in training
        model, checkpoint = common.load_model(args.checkpoint, device)
    except common.CheckpointError as err:
        hint = " Train one first: python mnist_train.py" if not args.checkpoint.exists() else ""
        print(f"error: {err}.{hint}", file=sys.stderr)
        return 1

    results, failed = [], 0
    for path in args.images:
        try:
            gray = digit_cleanup.load_gray(path)  # any picture, as gray 0..1 (0 = black)
            digit, warning = digit_cleanup.preprocess(gray)  # -> a 28x28 MNIST-style digit
            probs = classify(model, digit, checkpoint["mean"], checkpoint["std"], device)
        except ImageProblem as err:  # a file that is not a readable picture
            print(f"{path}: error: {err}", file=sys.stderr)
            failed += 1
            continue
        except Exception as err:  # a bug here: say so, and go on with the other pictures
            if args.debug:
                traceback.print_exc()
            print(f"{path}: error: unexpected {type(err).__name__}: {common.first_line(err)}. "
                  "This is a bug in predict.py: please report it with the picture (--debug "
                  "shows the traceback).", file=sys.stderr)
            failed += 1
            continue
        if warning:
            print(f"{path}: warning: {warning}; the guess below means nothing", file=sys.stderr)
        results.append({"path": str(path), "prediction": int(probs.argmax()),
                        "probabilities": [round(float(p), 6) for p in probs],
                        "warning": warning})
        if not args.json:
            top = probs.topk(args.top_k)
            guesses = ", ".join(f"{int(i)} ({p:.1%})" for p, i in zip(top.values, top.indices))
            print(f"{path}: {guesses}")
        if args.save_input is not None:
            try:
                save_input(args.save_input / f"{path.stem}.png", digit)
            except common.OutputError as err:
                print(f"{path}: error: {err}", file=sys.stderr)
                failed += 1
    if args.json:
        print(json.dumps(results, indent=2))
    return 1 if failed else 0


def classify(model: torch.nn.Module, digit: torch.Tensor, mean: float, std: float,
             device: torch.device) -> torch.Tensor:
    """The model's probability for each digit 0..9, given one 28 x 28 image (0..1)."""
    ## Normalise exactly as in training (the checkpoint records the mean and std it used), add
    ## the batch and channel dimensions the model expects, and run it without autograd.
    inputs = ((digit - mean) / std)[None, None].to(device)
    with torch.inference_mode():
        logits = model(inputs)
    return torch.softmax(logits, dim=1)[0].float().cpu()  # scores -> probabilities summing to 1


# the command line, and saving what the model saw ---------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("images", nargs="+", type=Path, help="image files (PNG, JPEG, ...)")
    parser.add_argument("--checkpoint", type=Path, default=Path("checkpoints/mnist_mlp.pt"),
                        help="a checkpoint written by mnist_train.py")
    parser.add_argument("--top-k", type=top_k, default=1, help="also show the next K-1 guesses")
    parser.add_argument("--json", action="store_true", help="print a JSON list instead")
    parser.add_argument("--save-input", type=Path, metavar="DIR", default=None,
                        help="save the 28x28 image the model saw for each input into DIR")
    parser.add_argument("--device", default="cpu", help="cpu is plenty for a few images")
    parser.add_argument("--debug", action="store_true",
                        help="show the full traceback when a picture fails unexpectedly")
    return parser


def top_k(text: str) -> int:
    """argparse type: an int from 1 to 10."""
    if not text.isdigit() or not 1 <= int(text) <= 10:
        raise argparse.ArgumentTypeError(f"must be a whole number from 1 to 10, got {text!r}")
    return int(text)


def save_input(path: Path, digit: torch.Tensor) -> None:
    """Save the 28 x 28 image the model saw as a PNG, atomically."""
    pixels = (digit * 255).round().to(torch.uint8)
    buffer = io.BytesIO()
    Image.frombytes("L", (28, 28), bytes(pixels.flatten().tolist())).save(buffer, format="PNG")
    common.write_atomically(path, buffer.getvalue())


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # Ctrl-C: one line, and the exit code a shell expects
        print("\ninterrupted: stopped.", file=sys.stderr)
        sys.exit(130)
