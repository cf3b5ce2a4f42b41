"""Classify your own pictures of handwritten digits with the model mnist_train.py saved.

    python mnist_train.py --epochs 5                  # once: writes checkpoints/mnist_mlp.pt
    python predict.py samples/photo_3.jpg             # a picture that comes with the repo
    python predict.py photos/*.jpg --top-k 3          # also the runner-up guesses
    python predict.py my_digit.png --model cnn        # mnist_train.py --model cnn's checkpoint
    python predict.py my_digit.png --json             # machine-readable output
    python predict.py my_digit.png --save-input seen  # seen/my_digit.png: what the model saw
    python predict.py --serve                         # a page to draw on: http://127.0.0.1:8000/

What you should see: the model that answers, then one line per picture:

    checkpoints/mnist_mlp.pt: mlp 784-128-64-10, epoch 4, val acc 0.9720
    samples/photo_3.jpg: 3 (100.0%)

A first week's last script: load the checkpoint, clean up the picture, classify. A model knows
only the kind of pictures it was trained on, MNIST's white digits on black, 20 x 20 pixels in a
28 x 28 frame: plumbing/digit_cleanup.py first turns any picture into one (or warns that it
holds none, or several). read_and_classify(), classify() and class_names() are the part to copy.
"""

import io
import json
import os
import sys
from pathlib import Path

import torch
from PIL import Image

import common
from plumbing import digit_cleanup, safeguards
from plumbing.digit_cleanup import ImageProblem


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.serve == bool(args.images) or args.serve and (args.json or args.save_input or
                                                           args.top_k != 1):
        parser.error("give one or more pictures, or --serve to draw on a page (it takes no "
                     "pictures, --json, --save-input or --top-k: it shows all that itself)")
    path = args.checkpoint or Path("checkpoints") / f"mnist_{args.model or 'mlp'}.pt"
    try:
        device = common.get_device(args.device)
    except ValueError as err:
        parser.error(str(err))
    ## 1. The model, rebuilt, and the dict save_checkpoint wrote ("mean", "std", "classes"...).
    try:
        model, checkpoint = common.load_model(path, device)
    except common.CheckpointError as err:
        how = (f" --save-path {path}" if args.checkpoint else
               f" --model {args.model}" * (args.model not in (None, "mlp")))
        cnn = " (for a CNN, add --model cnn)" * bool(args.checkpoint)  # the command comes last
        print(f"error: {err}." if os.path.exists(path) else f"error: checkpoint {path.resolve()} "
              f"does not exist. Train one first{cnn}: python mnist_train.py{how}", file=sys.stderr)
        return 1
    if args.save_input and (problem := safeguards.check_output_dir(args.save_input)):
        parser.error(f"--save-input {args.save_input}: {problem}")
    if checkpoint.get("dataset", "mnist") != "mnist":
        print(f"note: {path} was trained on {checkpoint['dataset']}, not digits: pictures are "
              "only scaled to 28x28, light on dark, without the digit clean-up", file=sys.stderr)
    if args.serve:  # the page sends each picture through read_and_classify(), as below
        from plumbing import digit_server

        about = {"checkpoint": str(path), "model": checkpoint["model_name"],
                 "epoch": checkpoint.get("epoch"), "val_accuracy": checkpoint.get("val_accuracy"),
                 "classes": class_names(checkpoint)}
        return digit_server.run(args.host, args.port, page_answer(model, checkpoint, device),
                                about, args.debug)
    if not args.json:  # which model answers: each training run replaces the default one
        safeguards.say(f"{path}: {describe(checkpoint, model)}")
    results, paths = [], safeguards.expand_patterns(args.images)  # *.jpg, where no shell did
    names = safeguards.new_names(paths, args.save_input)  # never a picture's own name in DIR
    for picture in paths:
        ## 2. Clean up and classify; a picture that fails is one line, and the next one goes on.
        try:
            if picture.suffix.lower() in (".pt", ".pth") and picture.is_file():
                raise ImageProblem(f"is a checkpoint, not a picture: did you mean --checkpoint "
                                   f"{picture}?")
            result, digit, probs = read_and_classify(picture, model, checkpoint, device)
        except Exception as err:
            results.append({"path": str(picture), "error": safeguards.failure(
                err, ImageProblem, args.debug, f"{picture}: error: ")})
            continue
        if warning := result["warning"]:  # "no digit found ...": the guess means little
            meaning = "means nothing" if warning.startswith("no digit") else "reads it all as one"
            safeguards.say(f"{picture}: warning: {warning}; the guess {meaning}", sys.stderr)
        results.append({"path": str(picture), **result, "checkpoint": str(path),
                        "model": checkpoint["model_name"]})
        if not args.json:
            top = probs.topk(args.top_k)
            safeguards.say(f"{picture}: " + ", ".join(f"{class_names(checkpoint)[i]} ({p:.1%})"
                                                      for p, i in zip(top.values, top.indices)))
        if args.save_input:
            try:
                save_input(args.save_input / f"{names[picture]}.png", digit)
            except common.OutputError as err:  # classified, but what it saw cannot be saved
                results[-1]["save_input_error"] = problem = (
                    f"--save-input could not save what the model saw: {err}")
                safeguards.say(f"{picture}: error: {problem}", sys.stderr)
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
    return ({"prediction": best, "class": class_names(checkpoint)[best],
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


def class_names(checkpoint: dict) -> list[str]:
    """The model's class names: "0" to "9" for digits (older checkpoints name none)."""
    return checkpoint.get("classes") or [str(d) for d in range(10)]


def describe(checkpoint: dict, model: torch.nn.Module | None = None) -> str:
    """'mlp 784-128-64-10, epoch 4, val acc 0.9720' (and the dataset, when not MNIST)."""
    name = checkpoint["model_name"]
    if isinstance(model, common.MLP):  # its layer sizes, from the layers themselves
        sizes = [layer.out_features for layer in model.children()]
        name += " " + "-".join(map(str, [model.fc1.in_features, *sizes]))
    data = checkpoint.get("dataset", "mnist")
    accuracy = checkpoint.get("val_accuracy")  # made by hand, a checkpoint may give no number
    accuracy = f"{accuracy:.4f}" if isinstance(accuracy, (int, float)) else "?"
    return (f"{name}{'' if data == 'mnist' else f' on {data}'}, epoch "
            f"{checkpoint.get('epoch', '?')}, val acc {accuracy}")


def page_answer(model: torch.nn.Module, checkpoint: dict, device: torch.device):
    """The page's answer to a picture: read_and_classify()'s result and input, or an error."""
    def answer(picture: bytes) -> dict:
        try:
            result, digit, _ = read_and_classify(io.BytesIO(picture), model, checkpoint, device)
        except ImageProblem as err:
            return {"error": f"the picture {err}"}
        return {**result, "input": (digit * 255).round().to(torch.uint8).tolist()}

    return answer


def save_input(path: Path, digit: torch.Tensor) -> None:
    """Save the 28 x 28 image the model saw as a PNG, whole."""
    buffer = io.BytesIO()
    pixels = bytes((digit * 255).round().to(torch.uint8).flatten().tolist())
    Image.frombytes("L", (28, 28), pixels).save(buffer, format="PNG")
    common.write_atomically(path, buffer.getvalue())


def build_parser() -> safeguards.ArgumentParser:
    parser = safeguards.ArgumentParser(description=__doc__.split("\n")[0])
    add = parser.add_argument
    add("images", nargs="*", type=Path, help="picture files (PNG, JPEG, ...)")
    which = parser.add_mutually_exclusive_group().add_argument  # one of the two, or neither
    which("--checkpoint", type=Path, help="from mnist_train.py (default: checkpoints/mnist_mlp.pt)")
    which("--model", choices=sorted(common.MODELS), help="use checkpoints/mnist_<model>.pt")
    add("--top-k", type=safeguards.number_from(1, 10), default=1,
        help="also show the next K-1 guesses (--json lists every class's probability)")
    add("--json", action="store_true", help="print a JSON list instead")
    add("--save-input", type=Path, metavar="DIR",
        help="save the 28x28 image the model saw for each picture into DIR")
    add("--device", default="cpu", help="cpu is plenty for a few pictures")
    add("--serve", action="store_true", help="serve a page to draw digits on, at http://HOST:PORT/")
    add("--host", default="127.0.0.1", help="with --serve: 0.0.0.0 shares it with your network")
    add("--port", type=safeguards.number_from(0, 65535), default=8000,
        help="with --serve (0: any free port)")
    add("--debug", action="store_true", help="show the traceback of an unexpected error")
    return parser


if __name__ == "__main__":
    safeguards.run_script(main)
