"""Classify your own pictures of handwritten digits with a model that a training script saved.

    python mnist_train.py --epochs 5                  # once: writes checkpoints/mnist_mlp.pt
    python predict.py samples/photo_3.jpg             # a picture that comes with the repo
    python predict.py photos/*.jpg --top-k 3          # also the runner-up guesses
    python predict.py my_digit.png --model cnn        # mnist_train.py --model cnn's checkpoint
    python predict.py samples/photo_3.jpg --checkpoint mnist_minimal.pt   # rung 1's state_dict
    python predict.py my_digit.png --save-input seen  # seen/my_digit.png: what the model saw
    python predict.py --serve                         # a page to draw on: http://127.0.0.1:8000/

What you should see: the model that answers, then one line per picture:

    checkpoints/mnist_mlp.pt: mlp 784-128-64-10, epoch 4, val acc 0.9718
    samples/photo_3.jpg: 3 (100.0%)

The first week's last script: load the saved model, clean up the picture, classify it. A model
knows only the kind of pictures it was trained on, MNIST's white digits on black, 20 x 20
pixels in a 28 x 28 frame: plumbing/digit_cleanup.py first turns any picture into one (or
warns that it holds none, or several). read_and_classify() and classify() are the part to copy.
"""

import json
import sys
from functools import partial
from pathlib import Path

import torch

import common
from plumbing import digit_cleanup, digit_server, files, runs
from plumbing.runs import ArgumentParser, say


def main(argv: list[str] | None = None) -> int:
    args, parser, device = read_command_line(argv)
    path = args.checkpoint or Path("checkpoints") / f"mnist_{args.model or 'mlp'}.pt"
    ## 1. The model. A checkpoint holds the weights by layer name (a state_dict): its model's
    ## class is rebuilt, from the name and sizes saved beside them, and load_state_dict() puts
    ## the weights into it. A plain state_dict, as mnist_minimal.py saves, is recognised by
    ## its layers' names and shapes. torch.load(weights_only=True) reads it: it cannot run code.
    try:
        model, checkpoint = files.load_model(path, device)
    except files.CheckpointError as err:
        say(files.checkpoint_error(err, path, args.checkpoint, args.model), sys.stderr)
        return 1
    if args.save_input and (problem := files.check_output_dir(args.save_input)):
        parser.error(f"--save-input {args.save_input}: {problem}")
    if checkpoint.get("dataset", "mnist") != "mnist":  # see read_and_classify()
        say(f"note: {path} was trained on {checkpoint['dataset']}, not digits: pictures are only "
            "scaled to 28x28, light on dark, without the digit clean-up", sys.stderr)
    if args.serve:  # the page sends each picture through read_and_classify(), as below
        return digit_server.run(args, path, checkpoint, partial(
            read_and_classify, model=model, checkpoint=checkpoint, device=device))
    if not args.json:  # which model answers: each training run replaces the default one
        say(f"{path}: {files.describe(checkpoint, model)}")
    ## 2. Each picture, cleaned up and classified; one that fails is one line, and the next
    ## one goes on.
    results, paths = [], runs.expand_patterns(args.images)  # *.jpg: where no shell did
    names = runs.new_names(paths, args.save_input)  # never a picture's own name in DIR
    for picture in paths:
        try:
            result, digit, probs = read_and_classify(picture, model, checkpoint, device)
        except Exception as err:
            results.append({"path": str(picture), "error": runs.failure(
                err, digit_cleanup.ImageProblem, args.debug, f"{picture}: error: ")})
            continue
        if warning := result["warning"]:  # "no digit found ...": the guess means little
            meaning = "means nothing" if warning.startswith("no digit") else "reads it all as one"
            say(f"{picture}: warning: {warning}; the guess {meaning}", sys.stderr)
        results.append({"path": str(picture), **result, "checkpoint": str(path),
                        "model": checkpoint["model_name"]})
        if not args.json:
            top = probs.topk(args.top_k)
            say(f"{picture}: " + ", ".join(f"{checkpoint['classes'][i]} ({p:.1%})"
                                           for p, i in zip(top.values, top.indices)))
        if args.save_input:  # what the model saw, as a 28 x 28 PNG
            runs.save_input(args.save_input / f"{names[picture]}.png", digit, results[-1])
    if args.json:
        print(json.dumps(results, indent=2))
    return 1 if any("error" in r or "save_input_error" in r for r in results) else 0


def read_and_classify(source, model: torch.nn.Module, checkpoint: dict,
                      device: torch.device) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """Clean up and classify a picture (a path or file object): the result {"prediction", "class",
    "probabilities", "warning"}, the 28 x 28 input the model saw, the probabilities as a tensor."""
    gray = digit_cleanup.load_gray(source)  # any picture, as gray 0..1 (0 = black)
    if checkpoint.get("dataset", "mnist") == "mnist":
        digit, warning = digit_cleanup.preprocess(gray)  # -> a 28x28 MNIST-style digit
    else:  # the clean-up knows digits only: other pictures are just made small, light on dark
        digit, warning = digit_cleanup.plain_28x28(gray), None
    probs = classify(model, digit, checkpoint["mean"], checkpoint["std"], device)
    best = int(probs.argmax())
    return ({"prediction": best, "class": checkpoint["classes"][best],
             "probabilities": [round(float(p), 6) for p in probs], "warning": warning},
            digit, probs)


def classify(model: torch.nn.Module, digit: torch.Tensor, mean: float, std: float,
             device: torch.device) -> torch.Tensor:
    """The model's probability for each of its classes, given one 28 x 28 image (0..1)."""
    inputs = ((digit - mean) / std)[None, None].to(device)  # as in training; [1, 1, 28, 28]
    model.eval()  # Dropout off: the same picture always gets the same answer
    with torch.inference_mode():  # no autograd graph: nothing will call backward()
        logits = model(inputs)  # [1, 10]: one score per class, for the batch of one
    return torch.softmax(logits, dim=1)[0].float().cpu()  # probabilities that sum to 1


# ---------------------------------------------------------------------------------------------
# The command line.

def build_parser() -> ArgumentParser:
    parser = ArgumentParser(description=__doc__.split("\n")[0])
    add = parser.add_argument
    add("images", nargs="*", type=Path, help="picture files (PNG, JPEG, ...)")
    which = parser.add_mutually_exclusive_group().add_argument  # one of the two, or neither
    which("--checkpoint", type=Path, help="a model file saved by mnist_train.py or "
          "mnist_minimal.py (default: checkpoints/mnist_mlp.pt)")
    which("--model", choices=sorted(common.MODELS), help="use checkpoints/mnist_<model>.pt")
    add("--top-k", type=runs.number_from(1, 10), default=1,
        help="also show the next K-1 guesses (--json lists every class's probability)")
    add("--json", action="store_true", help="print a JSON list instead")
    add("--save-input", type=Path, metavar="DIR",
        help="save the 28x28 image the model saw for each picture into DIR")
    add("--device", default="cpu", help="cpu is plenty for a few pictures")
    add("--serve", action="store_true", help="serve a page to draw digits on, at http://HOST:PORT/")
    add("--host", default="127.0.0.1", help="with --serve: 0.0.0.0 shares it with your network")
    add("--port", type=runs.number_from(0, 65535), default=8000,
        help="with --serve (0: any free port)")
    add("--debug", action="store_true", help="show the traceback of an unexpected error")
    return parser


def read_command_line(argv: list[str] | None):
    """The parsed flags, the parser and the device; a usage error exits with code 2."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.serve == bool(args.images) or args.serve and (args.json or args.save_input or
                                                           args.top_k != 1):
        parser.error("give one or more pictures, or --serve to draw on a page (it takes no "
                     "pictures, --json, --save-input or --top-k: it shows all that itself)")
    try:
        return args, parser, common.get_device(args.device)
    except ValueError as err:
        parser.error(str(err))


if __name__ == "__main__":
    runs.run_script(main)
