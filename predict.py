"""Classify your own pictures of handwritten digits with the model mnist_train.py saved.

    python mnist_train.py --epochs 5                  # once: writes checkpoints/mnist_mlp.pt
    python predict.py my_digit.png                    # my_digit.png: 7 (98.6%)
    python predict.py photos/*.jpg --top-k 3          # also the runner-up guesses
    python predict.py my_digit.png --json             # machine-readable output
    python predict.py my_digit.png --save-input seen  # writes seen/my_digit.png, what the model saw

A model only knows the kind of images it was trained on. MNIST digits are white on black, about
20x20 pixels inside a 28x28 frame, centred by their centre of mass, with strokes 2-3 pixels
wide. A phone photo of a digit is none of that, so preprocess() first turns any picture into such
an image, step by step, then normalises it exactly as training did (mean and std come from the
checkpoint).
"""

import argparse
import json
import sys
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from PIL import Image, ImageOps, UnidentifiedImageError

import common

Image.MAX_IMAGE_PIXELS = 120_000_000  # above this, refuse: a "decompression bomb" would eat RAM
WORK_SIZE = 1024  # larger pictures are shrunk to this many pixels on their long side first


class ImageProblem(Exception):
    """A picture that cannot be classified; reported for that file, then the next one is tried."""


# 1. reading a picture ------------------------------------------------------------------------
def load_gray(path: Path) -> torch.Tensor:
    """Read any picture as a float tensor H x W in 0..1 (0 = black), upright, alpha on white."""
    if not path.exists():
        raise ImageProblem("no such file")
    if path.is_dir():
        raise ImageProblem("is a directory; pass the image files inside it (e.g. dir/*.png)")
    if path.stat().st_size == 0:
        raise ImageProblem("is empty (0 bytes)")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(path)  # reads only the header: a bomb is refused before decoding
            img.draft("RGB", (WORK_SIZE, WORK_SIZE))  # JPEG: decode at a reduced size, faster
            img.load()
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as err:
        raise ImageProblem(f"refused: too many pixels to decode safely ({err})") from None
    except UnidentifiedImageError:
        raise ImageProblem("is not an image Pillow can read (PNG, JPEG, BMP, GIF, TIFF, "
                           "WebP...)") from None
    except (OSError, SyntaxError, ValueError) as err:
        raise ImageProblem(f"is truncated or damaged ({err})") from None
    img = ImageOps.exif_transpose(img)  # phones store "rotate me" in EXIF instead of rotating
    if img.mode in ("I;16", "I;16B", "I;16L", "I", "F"):  # 16-bit or float grayscale
        x = torch.frombuffer(bytearray(img.convert("F").tobytes()), dtype=torch.float32)
        x = x.view(img.height, img.width)
        return x / (65535.0 if x.max() > 255 else 255.0 if x.max() > 1 else 1.0)
    if img.mode in ("RGBA", "LA", "PA", "P") or "transparency" in img.info:
        ## Transparent pixels have arbitrary colour underneath (often black, like the ink).
        ## Put them on white paper, the way the picture looks in a viewer.
        rgba = img.convert("RGBA")
        img = Image.alpha_composite(Image.new("RGBA", rgba.size, "white"), rgba)
    gray = img.convert("L")  # also handles CMYK, palette, 1-bit and YCbCr images
    x = torch.frombuffer(bytearray(gray.tobytes()), dtype=torch.uint8).view(gray.height, gray.width)
    return x.float() / 255


# 2. turning it into an MNIST digit ---------------------------------------------------------------
def preprocess(gray: torch.Tensor) -> torch.Tensor:
    """Turn a grayscale picture (H x W, 0..1) into a 28 x 28 MNIST-style digit (white on black)."""
    x = shrink(gray, WORK_SIZE)
    ink = ink_map(x)
    box = digit_box(ink)
    if box is None:
        return torch.zeros(28, 28)
    top, bottom, left, right = box
    return centre_by_mass(fit_in_box(ink[top:bottom, left:right], 20), 28)


def shrink(x: torch.Tensor, size: int) -> torch.Tensor:
    """Scale down so the long side is at most `size` (area averaging keeps thin strokes)."""
    scale = size / max(x.shape)
    if scale >= 1:
        return x
    out_size = (max(1, round(x.shape[0] * scale)), max(1, round(x.shape[1] * scale)))
    return F.interpolate(x[None, None], size=out_size, mode="area")[0, 0]


def ink_map(x: torch.Tensor) -> torch.Tensor:
    """Return how much ink each pixel holds, 0..1, whichever way round the picture is."""
    ## The paper is what fills the border of the picture; the ink is what differs from it.
    ## Dark ink on light paper and a white-on-black drawing both end up as ink = 1.
    border = torch.cat([x[0], x[-1], x[:, 0], x[:, -1]])
    paper = border.median()
    dark_tail = paper - torch.quantile(x.flatten()[:: max(1, x.numel() // 100_000)], 0.005)
    light_tail = torch.quantile(x.flatten()[:: max(1, x.numel() // 100_000)], 0.995) - paper
    ink = (paper - x) if dark_tail >= light_tail else (x - paper)
    ink = ink.clamp(min=0)
    peak = torch.quantile(ink.flatten()[:: max(1, ink.numel() // 100_000)], 0.999)
    if peak <= 0.05:  # less contrast than paper grain: there is no digit
        return torch.zeros_like(ink)
    ink = (ink / peak).clamp(0, 1)
    ## Keep the soft edge pixels next to strong strokes (MNIST has them too) but drop faint
    ## specks of paper grain and noise that are nowhere near a stroke.
    near_stroke = F.max_pool2d((ink > 0.5).float()[None, None], 3, stride=1, padding=1)[0, 0]
    return torch.where((near_stroke > 0) & (ink > 0.1), ink, torch.zeros_like(ink))


def digit_box(ink: torch.Tensor) -> tuple[int, int, int, int] | None:
    """Bounding box (top, bottom, left, right) of the inked pixels, or None if there are none."""
    rows = (ink > 0).any(dim=1).nonzero()
    cols = (ink > 0).any(dim=0).nonzero()
    if len(rows) == 0:
        return None
    return int(rows[0]), int(rows[-1]) + 1, int(cols[0]), int(cols[-1]) + 1


def fit_in_box(digit: torch.Tensor, box: int) -> torch.Tensor:
    """Scale the cropped digit so that its longer side is `box` pixels, keeping its aspect ratio."""
    h, w = digit.shape
    scale = box / max(h, w)
    size = (max(1, round(h * scale)), max(1, round(w * scale)))
    mode = "area" if scale < 1 else "bilinear"  # area averaging when shrinking: no aliasing
    return F.interpolate(digit[None, None], size=size, mode=mode)[0, 0].clamp(0, 1)


def centre_by_mass(digit: torch.Tensor, size: int) -> torch.Tensor:
    """Paste `digit` into a size x size black frame with its centre of mass in the middle."""
    h, w = digit.shape
    total = digit.sum().clamp(min=1e-6)
    cy = (digit.sum(dim=1) * torch.arange(h)).sum() / total
    cx = (digit.sum(dim=0) * torch.arange(w)).sum() / total
    top = round(size / 2 - cy.item())  # MNIST puts the centre of mass at pixel (14, 14)
    left = round(size / 2 - cx.item())
    top, left = min(max(top, 0), size - h), min(max(left, 0), size - w)  # stay inside the frame
    out = torch.zeros(size, size)
    out[top : top + h, left : left + w] = digit
    return out


# 3. classifying ------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("images", nargs="+", type=Path, help="image files (PNG, JPEG, ...)")
    parser.add_argument("--checkpoint", type=Path, default=Path("checkpoints/mnist_mlp.pt"),
                        help="a checkpoint written by mnist_train.py")
    parser.add_argument("--top-k", type=int, default=1, help="also show the next K-1 guesses")
    parser.add_argument("--json", action="store_true", help="print a JSON list instead")
    parser.add_argument("--save-input", type=Path, metavar="DIR", default=None,
                        help="save the 28x28 image the model saw for each input into DIR")
    parser.add_argument("--device", default="cpu", help="cpu is plenty for a few images")
    args = parser.parse_args(argv)
    if not 1 <= args.top_k <= 10:
        parser.error("--top-k must be between 1 and 10")
    try:
        device = common.get_device(args.device)
    except ValueError as err:
        parser.error(str(err))
    try:
        model, checkpoint = common.load_model(args.checkpoint, device)
    except common.CheckpointError as err:
        hint = " Train one first: python mnist_train.py" if not args.checkpoint.exists() else ""
        print(f"error: {err}.{hint}", file=sys.stderr)
        return 1

    results, failed = [], 0
    for path in args.images:
        try:
            digit = preprocess(load_gray(path))
        except ImageProblem as err:
            print(f"{path}: error: {err}", file=sys.stderr)
            failed += 1
            continue
        if digit.max() == 0:
            print(f"{path}: warning: no digit found (blank or uniform image); the guess below "
                  "means nothing", file=sys.stderr)
        if args.save_input is not None:
            args.save_input.mkdir(parents=True, exist_ok=True)
            pixels = (digit * 255).round().to(torch.uint8)
            Image.frombytes("L", (28, 28), bytes(pixels.flatten().tolist())).save(
                args.save_input / f"{path.stem}.png")
        ## Normalise exactly as in training, add a batch dimension, and run without autograd.
        inputs = ((digit - checkpoint["mean"]) / checkpoint["std"])[None, None].to(device)
        with torch.inference_mode():
            probs = torch.softmax(model(inputs), dim=1)[0].float().cpu()
        results.append((path, probs))
        if not args.json:
            top = probs.topk(args.top_k)
            guesses = ", ".join(f"{int(i)} ({p:.1%})" for p, i in zip(top.values, top.indices))
            print(f"{path}: {guesses}")
    if args.json:
        print(json.dumps([{"path": str(p), "prediction": int(pr.argmax()),
                           "probabilities": [round(float(v), 6) for v in pr]}
                          for p, pr in results], indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
