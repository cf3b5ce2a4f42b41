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
WORK_SIZE = 640  # larger pictures are shrunk to this many pixels on their long side first


class ImageProblem(Exception):
    """A picture that cannot be classified; reported for that file, then the next one is tried."""


# classifying: the main path ------------------------------------------------------------------
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
            digit = preprocess(load_gray(path))  # any picture -> a 28x28 MNIST-style digit
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
        probs = classify(model, digit, checkpoint["mean"], checkpoint["std"], device)
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


def classify(model: torch.nn.Module, digit: torch.Tensor, mean: float, std: float,
             device: torch.device) -> torch.Tensor:
    """The model's probability for each digit 0..9, given one 28 x 28 image (0..1)."""
    ## Normalise exactly as in training (the checkpoint records the mean and std it used), add
    ## the batch and channel dimensions the model expects, and run it without autograd.
    inputs = ((digit - mean) / std)[None, None].to(device)
    with torch.inference_mode():
        logits = model(inputs)
    return torch.softmax(logits, dim=1)[0].float().cpu()  # scores -> probabilities summing to 1


# reading a picture ------------------------------------------------------------------------
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
            img.draft("RGB", (2 * WORK_SIZE, 2 * WORK_SIZE))  # JPEG: decode at reduced size
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


# turning it into an MNIST digit ---------------------------------------------------------------
## Each step below exists for a kind of picture people really send; the comment says which.


def preprocess(gray: torch.Tensor) -> torch.Tensor:
    """Turn a grayscale picture (H x W, 0..1) into a 28 x 28 MNIST-style digit (white on black)."""
    if already_mnist(gray):  # e.g. an MNIST test image: every step below would only blur it
        return gray.clamp(0, 1)
    x = shrink(gray, WORK_SIZE)
    ink = remove_paper(x)  # ink = 1, paper = 0: any polarity, paper colour or lighting
    mask = ink > 0.45
    mask &= ~ruled_lines(mask)  # squared or lined paper
    mask = keep_digit(mask)  # drop specks, page edges, other marks
    if not mask.any():
        return torch.zeros(28, 28)
    rows, cols = mask.any(dim=1).nonzero()[:, 0], mask.any(dim=0).nonzero()[:, 0]
    ## Keep the soft edge pixels around the strokes (MNIST has them too), but only there.
    near = F.max_pool2d(mask.float()[None, None], 3, stride=1, padding=1)[0, 0] > 0
    digit = (ink * near)[rows[0] : rows[-1] + 1, cols[0] : cols[-1] + 1]
    return centre_by_mass(mnist_strokes(digit), 28)


def already_mnist(gray: torch.Tensor) -> bool:
    """True for a 28 x 28 white-on-black digit that fills about 20 x 20 and is centred by mass."""
    if gray.shape != (28, 28):
        return False
    border = torch.cat([gray[0], gray[-1], gray[:, 0], gray[:, -1]])
    ink = gray > 0.3
    if border.max() > 0.2 or not ink.any() or ink.float().mean() > 0.5:  # not white on black
        return False
    rows, cols = ink.any(dim=1).nonzero()[:, 0], ink.any(dim=0).nonzero()[:, 0]
    extent = max(rows[-1] - rows[0], cols[-1] - cols[0]) + 1
    total = gray.sum()
    cy = (gray.sum(dim=1) * torch.arange(28)).sum() / total
    cx = (gray.sum(dim=0) * torch.arange(28)).sum() / total
    return bool(16 <= extent <= 22 and abs(cy - 14) <= 1.5 and abs(cx - 14) <= 1.5)


def shrink(x: torch.Tensor, size: int) -> torch.Tensor:
    """Scale down so the long side is at most `size` (area averaging keeps thin strokes)."""
    scale = size / max(x.shape)
    if scale >= 1:
        return x
    out_size = (max(1, round(x.shape[0] * scale)), max(1, round(x.shape[1] * scale)))
    return F.interpolate(x[None, None], size=out_size, mode="area")[0, 0]


def remove_paper(x: torch.Tensor) -> torch.Tensor:
    """Return how much ink each pixel holds, 0..1, for dark-on-light and light-on-dark alike."""
    ## Dark ink on light paper, or a white-on-black drawing? The ink is whichever extreme, the
    ## darkest or the brightest few pixels (1 in 2,000: even a small digit in a big picture
    ## covers more), lies further from the paper. When the picture's border is clean, it is
    ## the paper. Otherwise (a tight crop, a dark table at the edge) compare against the local
    ## average instead, which also removes shadows and gradients.
    flat = x.flatten()
    few = max(1, flat.numel() // 2000)
    border = torch.cat([x[0], x[-1], x[:, 0], x[:, -1]])
    if (border - border.median()).abs().quantile(0.9) < 0.15:
        detail = flat - border.median()
    else:
        local_mean = F.interpolate(F.avg_pool2d(x[None, None], max(6, max(x.shape) // 16),
                                                ceil_mode=True), size=x.shape, mode="bilinear")
        detail = flat - local_mean.flatten()
    darkest, brightest = -detail.kthvalue(few).values, detail.kthvalue(flat.numel() - few).values
    ink = ink_darker_than_paper(x if darkest >= brightest else 1 - x)
    ## Contrast: a pencil is fainter than a marker. Scale so that the pen's typical darkness is
    ## 1, measured on the pixels clearly darker than the paper's grain (Otsu's threshold).
    strong = ink[ink > otsu_threshold(ink)]
    if strong.numel() < 4 or strong.quantile(0.9) < 0.08:  # nothing stands out: a blank page
        return torch.zeros_like(ink)
    return (ink / strong.quantile(0.9)).clamp(0, 1)


def ink_darker_than_paper(x: torch.Tensor) -> torch.Tensor:
    """Relative darkness of each pixel against the paper around it, 0..1."""
    ## Uneven light (a phone's shadow, a lamp on one side) and coloured paper: estimate the
    ## paper's own brightness around every pixel as the brightest value nearby (dark strokes
    ## narrower than the window vanish), then measure ink as darkness relative to it. The
    ## window works on a 16x smaller copy, which is fast and smooths the estimate.
    k = max(6, max(x.shape) // 16)
    local = F.max_pool2d(x[None, None], k, ceil_mode=True)
    local = F.avg_pool2d(F.max_pool2d(local, 3, 1, 1), 3, 1, 1, count_include_pad=False)
    paper = F.interpolate(local, size=x.shape, mode="bilinear", align_corners=False)[0, 0]
    return ((paper - x) / paper.clamp(min=0.1)).clamp(0, 1)


def otsu_threshold(values: torch.Tensor) -> float:
    """The cut that best separates two groups of values in 0..1 (Otsu's method, 64 bins)."""
    hist = torch.histc(values.flatten(), bins=64, min=0, max=1)
    centres = (torch.arange(64) + 0.5) / 64
    weight = hist.cumsum(0)  # pixels at or below each cut
    mean_low = (hist * centres).cumsum(0) / weight.clamp(min=1)
    mean_high = ((hist * centres).sum() - (hist * centres).cumsum(0)) / (
        weight[-1] - weight).clamp(min=1)
    between = weight * (weight[-1] - weight) * (mean_low - mean_high) ** 2
    return float(centres[between.argmax()] + 0.5 / 64)


def ruled_lines(mask: torch.Tensor) -> torch.Tensor:
    """Pixels of printed lines that cross the whole picture (squared or lined paper)."""
    ## A line is a long, straight, thin run of ink. A run at least 1/5 of the picture wide
    ## survives an "opening" (erode, then dilate, along the line); a slight tilt is tolerated by
    ## smearing the mask a pixel across it first. A digit's strokes are never this long *and*
    ## straight *and* repeated: only when two or more such lines span the picture is the paper
    ## ruled, and only then are they removed. This runs on a copy at most 256 pixels across.
    small, restore = at_most(mask, 256)
    lines = torch.zeros_like(small)
    for along in (0, 1):  # 0: horizontal lines, 1: vertical lines
        m = (small if along == 0 else small.T).float()[None, None]
        run = max(8, m.shape[3] // 5) | 1  # odd, so that padding keeps the size
        smeared = F.max_pool2d(m, (3, 1), 1, (1, 0))
        opened = -F.max_pool2d(-smeared, (1, run), 1, (0, run // 2))
        opened = F.max_pool2d(opened, (1, run), 1, (0, run // 2))[0, 0]
        on_line = (opened > 0) & (m[0, 0] > 0)
        full_rows = on_line.float().mean(dim=1) > 0.6  # rows where a line spans the picture
        separate_lines = (full_rows[1:] & ~full_rows[:-1]).sum() + full_rows[0]
        if separate_lines >= 2:
            ## Keep the pixels where a stroke crosses a line: there the ink runs on across it.
            crossing = -F.max_pool2d(-m, (5, 1), 1, (2, 0))[0, 0] > 0
            found = on_line & full_rows[:, None] & ~crossing
            lines |= found if along == 0 else found.T
    return restore(lines) & mask


def at_most(mask: torch.Tensor, size: int):
    """Shrink a mask (keeping every inked pixel) to at most `size` pixels across.

    Returns the small mask and a function that scales a small mask back to the full size.
    """
    scale = size / max(mask.shape)
    if scale >= 1:
        return mask, lambda small: small
    shape = (max(1, round(mask.shape[0] * scale)), max(1, round(mask.shape[1] * scale)))
    small = F.adaptive_max_pool2d(mask.float()[None, None], shape)[0, 0] > 0

    def restore(small: torch.Tensor) -> torch.Tensor:
        return F.interpolate(small.float()[None, None], size=mask.shape, mode="nearest")[0, 0] > 0

    return small, restore


def components(mask: torch.Tensor) -> torch.Tensor:
    """Label 8-connected regions of a boolean mask: 0 = background, 1, 2, ... = regions."""
    ## Every pixel starts with its own number and repeatedly takes the largest number among its
    ## neighbours, until each region carries a single number. "Pointer jumping" speeds this up:
    ## a pixel also copies the number held by the pixel its number points to.
    flat_mask = mask.flatten()
    labels = torch.arange(1, mask.numel() + 1, dtype=torch.float32) * flat_mask
    while True:
        grown = F.max_pool2d(labels.view(1, 1, *mask.shape), 3, 1, 1).flatten() * flat_mask
        for _ in range(4):
            grown = torch.maximum(grown, grown[(grown.long() - 1).clamp(min=0)] * flat_mask)
        if torch.equal(grown, labels):
            return torch.unique(labels, return_inverse=True)[1].view(mask.shape)
        labels = grown


def keep_digit(mask: torch.Tensor) -> torch.Tensor:
    """Keep the digit's strokes: the main blob of ink and the pieces close to it."""
    ## Work on a copy at most 128 pixels across: enough to tell blobs apart, and fast.
    small, restore = at_most(mask, 128)
    labels = components(small)
    count = int(labels.max())
    if count == 0:
        return mask
    h, w = small.shape
    ys, xs = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    area = torch.zeros(count + 1).index_add_(0, labels.flatten(), torch.ones(h * w))
    top = torch.full((count + 1,), h).scatter_reduce(0, labels.flatten(), ys.flatten(), "amin")
    bottom = torch.zeros(count + 1, dtype=torch.long).scatter_reduce(
        0, labels.flatten(), ys.flatten(), "amax")
    left = torch.full((count + 1,), w).scatter_reduce(0, labels.flatten(), xs.flatten(), "amin")
    right = torch.zeros(count + 1, dtype=torch.long).scatter_reduce(
        0, labels.flatten(), xs.flatten(), "amax")
    ## Edges of the page, the table beyond it, a finger: large marks along the picture's border.
    ## They count for little when choosing the digit, unless everything touches the border
    ## (a tightly cropped digit).
    touches = (top == 0) | (left == 0) | (bottom == h - 1) | (right == w - 1)
    score = area * torch.where(touches, 0.2, 1.0)
    score[0] = -1
    main = int(score.argmax())
    ## Pieces of the same digit (a "5" whose bar is detached, a broken pencil line) lie within
    ## half a digit of the main blob; specks and other marks lie further away or are tiny.
    size = max(bottom[main] - top[main], right[main] - left[main]) + 1
    gap = torch.maximum(torch.maximum(top - bottom[main], top[main] - bottom),
                        torch.maximum(left - right[main], left[main] - right)).clamp(min=0)
    keep = (gap <= size / 2) & (area >= 0.05 * area[main]) & ~(touches & ~touches[main])
    keep[0], keep[main] = False, True
    return mask & restore(keep[labels])


def mnist_strokes(digit: torch.Tensor) -> torch.Tensor:
    """Scale the cropped digit into MNIST's 20 x 20 box, with MNIST's stroke width."""
    ## Work at 4x the final size (an 80-pixel box), where stroke width can be measured and
    ## adjusted in whole pixels, then shrink by averaging 4x4 blocks: that gives the soft,
    ## anti-aliased edges MNIST digits have. MNIST strokes are about 2.4 px wide in the 20-px
    ## box, so 9.5 px here. A mouse's 1-px line is thickened; a marker's stroke is thinned.
    big = fit(digit, 80)
    big = big / big.flatten().quantile(0.99).clamp(min=1e-3)  # faint thin lines back to full ink
    big = F.pad(big.clamp(0, 1), (12, 12, 12, 12))
    width = stroke_width(big > 0.5)
    ## MNIST's own widths vary from about 1.5 to 3.5 px (6 to 14 here): leave those alone.
    steps = 0 if 6 <= width <= 14 else round((9.5 - width) / 2)  # pixels to add on each side
    if steps:
        k = 2 * abs(steps) + 1
        x = big[None, None]  # max-pooling spreads ink (thicker); min-pooling, the reverse
        x = F.max_pool2d(x, k, 1, k // 2) if steps > 0 else -F.max_pool2d(-x, k, 1, k // 2)
        big = x[0, 0]
    rows, cols = (big > 0.5).any(dim=1).nonzero()[:, 0], (big > 0.5).any(dim=0).nonzero()[:, 0]
    if len(rows) == 0:  # thinning erased it: keep the unthinned version
        return F.avg_pool2d(fit(digit, 80)[None, None], 4)[0, 0]
    big = fit(big[rows[0] : rows[-1] + 1, cols[0] : cols[-1] + 1], 80)
    h, w = big.shape
    big = F.pad(big, (0, -w % 4, 0, -h % 4))  # whole 4x4 blocks
    return F.avg_pool2d(big[None, None], 4)[0, 0]


def fit(x: torch.Tensor, box: int) -> torch.Tensor:
    """Resize so that the longer side is `box` pixels, keeping the aspect ratio."""
    h, w = x.shape
    scale = box / max(h, w)
    size = (max(1, round(h * scale)), max(1, round(w * scale)))
    mode = "area" if scale < 1 else "bilinear"  # area averaging when shrinking: no aliasing
    return F.interpolate(x[None, None], size=size, mode=mode)[0, 0].clamp(0, 1)


def stroke_width(mask: torch.Tensor) -> float:
    """Average stroke width in pixels: area divided by half the outline's length."""
    m = mask.float()[None, None]
    inner = -F.max_pool2d(-m, 3, stride=1, padding=1)  # pixels whose 8 neighbours are all ink
    outline = (m - inner).sum()
    return float(2 * m.sum() / outline.clamp(min=1))


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


if __name__ == "__main__":
    sys.exit(main())
