"""Pictures of handwritten digits like the ones people feed predict.py, made from MNIST test digits.

    python benchmarks/realistic_digits.py make --data-dir ../shared/data --out realistic
    python benchmarks/realistic_digits.py score --images realistic \
        --checkpoint checkpoints/mnist_mlp.pt checkpoints/mnist_cnn.pt
    python benchmarks/realistic_digits.py roundtrip --data-dir ../shared/data \
        --checkpoint checkpoints/mnist_mlp.pt [--compare-with ../old/digit_cleanup.py]
    python benchmarks/realistic_digits.py widths --data-dir ../shared/data
    python benchmarks/realistic_digits.py speed      # a 4000 x 3000 photo; a 100 MP picture
    python benchmarks/realistic_digits.py figure     # docs/what_the_model_sees.png

`make` writes 100 pictures for each of the 19 scenarios below (1,900 files, about 50 MB) and a
labels.csv. Everything is drawn from a fixed seed, so the set is identical on every machine.
The digits come from the MNIST *test* set, which no model here trains on. Each picture mimics
one way real input differs from MNIST, on top of a random tilt, size and position:

    photo        dark ink on white paper, uneven light, blur, sensor noise, JPEG
    ballpoint    thin blue ballpoint pen on white or cream paper
    marker       thick black marker
    pencil       grey, low-contrast strokes
    colour       dark ink on yellow, green, pink or blue paper
    grid         squared paper: printed grid lines cross the digit
    lined        ruled paper: horizontal lines
    shadow       a strong light gradient and a shadow across the page
    paint        white strokes on black, drawn in a paint program (PNG)
    mouse        1-pixel strokes drawn with a mouse, black on white (PNG)
    tight        cropped tightly around the digit
    margin       a small digit in a big, mostly empty picture
    tiny         a 28x28 or 32x32 low-quality JPEG
    small        a dark digit only 8-16 px tall in a 28-48 px JPEG, with or without anti-aliasing
    far          a small digit far from everything: under 5% of the picture's width
    thin         a paint program's 1-2 px pen (1 px where flat, 2 where steep, as Pillow draws
                 width=2), from black to light gray, on a white canvas; digits 250-600 px tall
                 (PNG)
    thin_small   a paint program's small canvas: a 1-px pen, black or faint gray (its darkest
                 pixel 107-181 of 255), the picture 28 or 32 px square (PNG)
    faint        a light pen's 1-px strokes on a 28 or 32 px canvas: most of the ink within 50
                 levels of the paper, darker where strokes cross, meet or end (PNG)
    transparent  white, black or coloured ink on a transparent canvas about 280 px square, as
                 drawing pages save it (PNG in mode RGBA, LA, or P with a transparency entry)

`roundtrip` is the clean-up's ground truth. It draws MNIST test digits (--digits of them) in
the scenarios of KEEP_WIDTH and NEW_WIDTH, without tilt, cleans each picture up and compares the
28x28 result with the original digit. Per scenario it prints the ink ratio (cleaned / original)
and the pixels' correlation with the original where the picture keeps the digit's own stroke
width, the stroke width that comes out where the picture changes it on purpose, the checkpoint's
accuracy, and the warnings; --compare-with measures another version's digit_cleanup.py on the
same pictures. `widths` prints MNIST's stroke widths, measured as the clean-up measures them, and
its ink: the clean-up's MNIST_WIDTH and MNIST_WIDTHS come from the training digits' line.

`score` runs predict.py's own reading and preprocessing on every picture and prints, for each
checkpoint, the accuracy per scenario and overall, next to the "naive" accuracy of the same
model on the same pictures converted to gray, squashed to 28x28 and inverted when the paper is
light. It also counts the pictures that got a no-digit warning (there should be none). It is a
tool for finding failure modes; real photos remain the final judge.
"""

import argparse
import csv
import importlib.util
import io
import math
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from PIL import Image, ImageDraw, ImageFont, ImageOps
from torchvision.transforms.v2.functional import pil_to_tensor
from torchvision.utils import make_grid, save_image

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
import predict
from plumbing import digit_cleanup, files

## New scenarios go at the end: every picture draws from one random stream, so a scenario
## added in the middle would change all the pictures after it.
SCENARIOS = ["photo", "ballpoint", "marker", "pencil", "colour", "grid", "lined", "shadow",
             "paint", "mouse", "tight", "margin", "tiny", "small", "far", "thin", "thin_small",
             "faint", "transparent"]
## The round trip (below) uses two groups. These draw the digit with its own stroke width, so
## the clean-up should give back the MNIST digit itself...
KEEP_WIDTH = ["photo", "pencil", "colour", "shadow", "paint", "tight", "margin", "transparent"]
## ...and these change it on purpose: mouse, thin, thin_small and faint are traced along the
## skeleton, ballpoint and marker are a thin and a fat pen. They have no true width, only MNIST's
## range.
NEW_WIDTH = ["mouse", "thin", "ballpoint", "marker", "thin_small", "faint"]


# drawing a digit -------------------------------------------------------------------------------
def digit_alpha(digit: torch.Tensor, height: int, rng: random.Random) -> torch.Tensor:
    """Upscale a 28x28 MNIST digit so its 20-pixel box is `height` tall; return ink in 0..1."""
    size = max(28, round(28 * height / 20))
    x = F.interpolate(digit[None, None].float() / 255, size=(size, size), mode="bicubic",
                      align_corners=False)[0, 0]
    ## MNIST's soft edges, magnified, look blurry: sharpen them into a pen-like stroke. The ramp
    ## is centred on MNIST's half level (0.4 to 0.6), so the stroke holds the digit's own ink.
    return ((x - 0.4) / 0.2).clamp(0, 1)


def change_width(alpha: torch.Tensor, pixels: int) -> torch.Tensor:
    """Thicken (pixels > 0) or thin (pixels < 0) the strokes by about `pixels` on each side."""
    if pixels == 0:
        return alpha
    k = 2 * abs(pixels) + 1
    x = alpha[None, None]
    x = F.max_pool2d(x, k, 1, k // 2) if pixels > 0 else -F.max_pool2d(-x, k, 1, k // 2)
    return x[0, 0]


def skeleton(alpha: torch.Tensor) -> torch.Tensor:
    """Thin the strokes to 1-pixel lines (Zhang-Suen thinning), like a 1-px mouse brush."""
    full = (alpha > 0.5).float()
    if not full.any():
        return full
    ## Only the box around the ink: the same lines, in half the time for a big digit.
    rows, cols = full.any(1).nonzero()[:, 0], full.any(0).nonzero()[:, 0]
    box = (slice(int(rows[0]), int(rows[-1]) + 1), slice(int(cols[0]), int(cols[-1]) + 1))
    img = full[box]
    while True:
        changed = False
        for step in (0, 1):
            n, transitions = around(img)
            count = sum(n)
            if step == 0:
                extra = (n[0] * n[2] * n[4] == 0) & (n[2] * n[4] * n[6] == 0)
            else:
                extra = (n[0] * n[2] * n[6] == 0) & (n[0] * n[4] * n[6] == 0)
            remove = (img == 1) & (count >= 2) & (count <= 6) & (transitions == 1) & extra
            if remove.any():
                img[remove] = 0
                changed = True
        if not changed:
            return full


def around(img: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Each pixel's 8 neighbours, clockwise from the one above (p2 to p9 in Zhang and Suen's
    paper), and how many times that ring of neighbours goes from paper to ink."""
    p = F.pad(img, (1, 1, 1, 1))
    h, w = img.shape
    n = [p[0:h, 1:w + 1], p[0:h, 2:], p[1:h + 1, 2:], p[2:, 2:],
         p[2:, 1:w + 1], p[2:, 0:w], p[1:h + 1, 0:w], p[0:h, 0:w]]
    return n, sum(((n[i] == 0) & (n[(i + 1) % 8] == 1)).float() for i in range(8))


def knots(line: torch.Tensor) -> torch.Tensor:
    """The pixels of a 1-pixel line where strokes cross or meet (3 branches or more) or end (1
    neighbour): where a pen goes over the same spot again, or rests."""
    n, branches = around(line)
    return line * ((branches >= 3) | (sum(n) == 1)).float()


def rotate(alpha: torch.Tensor, degrees: float) -> torch.Tensor:
    """Rotate about the centre, growing the canvas so that nothing is cut off."""
    a = math.radians(degrees)
    h, w = alpha.shape
    size = math.ceil(math.hypot(h, w))
    x = F.pad(alpha, ((size - w) // 2, size - w - (size - w) // 2,
                      (size - h) // 2, size - h - (size - h) // 2))
    theta = torch.tensor([[[math.cos(a), -math.sin(a), 0.0], [math.sin(a), math.cos(a), 0.0]]])
    grid = F.affine_grid(theta, [1, 1, size, size], align_corners=False)
    out = F.grid_sample(x[None, None], grid, align_corners=False)[0, 0]
    rows, cols = (out > 0.02).any(1).nonzero(), (out > 0.02).any(0).nonzero()
    return out[rows[0]:rows[-1] + 1, cols[0]:cols[-1] + 1]


# drawing the paper ------------------------------------------------------------------------------
def smooth_noise(h: int, w: int, cells: int, g: torch.Generator) -> torch.Tensor:
    """Low-frequency noise in -1..1: blotchy paper, uneven light."""
    coarse = torch.rand(1, 1, cells, cells, generator=g) * 2 - 1
    return F.interpolate(coarse, size=(h, w), mode="bicubic", align_corners=False)[0, 0]


def lighting(h: int, w: int, strength: float, rng: random.Random) -> torch.Tensor:
    """A multiplicative light field: a linear gradient in a random direction (1 = full light)."""
    angle = rng.uniform(0, 2 * math.pi)
    ys, xs = torch.meshgrid(torch.linspace(-1, 1, h), torch.linspace(-1, 1, w), indexing="ij")
    ramp = (xs * math.cos(angle) + ys * math.sin(angle)) / 2 + 0.5  # 0..1 across the page
    return 1 - strength * ramp


def shadow(h: int, w: int, rng: random.Random) -> torch.Tensor:
    """A soft-edged shadow over part of the page, like a phone or a hand in the light."""
    ys, xs = torch.meshgrid(torch.linspace(-1, 1, h), torch.linspace(-1, 1, w), indexing="ij")
    angle, offset = rng.uniform(0, 2 * math.pi), rng.uniform(-0.6, 0.6)
    side = xs * math.cos(angle) + ys * math.sin(angle) - offset
    return 1 - rng.uniform(0.3, 0.55) * torch.sigmoid(side * rng.uniform(4, 12))


def blur(img: torch.Tensor, sigma: float) -> torch.Tensor:
    """Gaussian blur of a C x H x W image."""
    if sigma < 0.3:
        return img
    radius = math.ceil(3 * sigma)
    k = torch.exp(-(torch.arange(-radius, radius + 1) ** 2) / (2 * sigma**2))
    k = (k / k.sum()).view(1, 1, 1, -1).expand(img.shape[0], 1, 1, -1)
    x = F.pad(img[None], (radius, radius, radius, radius), mode="replicate")
    x = F.conv2d(x, k, groups=img.shape[0])
    x = F.conv2d(x, k.transpose(2, 3), groups=img.shape[0])
    return x[0]


def render(digit: torch.Tensor, scenario: str, rng: random.Random, g: torch.Generator,
           round_trip: bool = False) -> tuple[Image.Image, str]:
    """Draw one picture of `digit` (28x28 uint8) for `scenario`; return (image, file suffix).

    round_trip: no tilt, and the scenarios of KEEP_WIDTH draw the digit's own stroke width
    (pencil and paint vary it otherwise), so that the original is what the clean-up should give.
    """
    height = round(math.exp(rng.uniform(math.log(60), math.log(260))))  # digit height in px
    width_change, thin = 0, False
    paper = (rng.uniform(0.86, 0.98),) * 3
    ink = (rng.uniform(0.02, 0.12),) * 3
    light, sigma, noise, quality = rng.uniform(0, 0.3), rng.uniform(0, 1.2), 0.02, 85
    margin = rng.uniform(0.25, 1.5)  # empty space around the digit, in digit heights
    if scenario == "ballpoint":
        ink = (rng.uniform(0.05, 0.2), rng.uniform(0.1, 0.3), rng.uniform(0.45, 0.7))
        paper = (0.97, 0.96, rng.uniform(0.85, 0.95))
        thin = True
    elif scenario == "marker":
        width_change = max(2, height // 25)
    elif scenario == "pencil":
        ink = (rng.uniform(0.45, 0.6),) * 3
        width_change = -max(1, height // 60)
    elif scenario == "colour":
        paper = rng.choice([(0.98, 0.93, 0.55), (0.75, 0.92, 0.75), (0.98, 0.78, 0.85),
                            (0.72, 0.85, 0.98)])
    elif scenario == "shadow":
        light = rng.uniform(0.3, 0.5)
    elif scenario == "paint":
        paper, ink, light, sigma, noise = (0.0,) * 3, (1.0,) * 3, 0.0, 0.0, 0.0
        width_change = rng.choice([0, height // 30])
    elif scenario == "mouse":
        paper, ink, light, sigma, noise = (1.0,) * 3, (0.0,) * 3, 0.0, 0.0, 0.0
        thin, height = True, round(rng.uniform(120, 300))
    elif scenario == "tight":
        margin = rng.uniform(0.0, 0.08)
    elif scenario == "margin":
        height, margin = round(rng.uniform(30, 60)), rng.uniform(4, 8)
    elif scenario == "tiny":
        height, margin, sigma, quality = 20, 0.2, rng.uniform(0, 0.5), rng.randint(30, 70)
    elif scenario == "small":  # drawn at its final size, like a digit in a small screenshot
        height, side, quality = rng.randint(8, 16), rng.randint(28, 48), rng.randint(60, 85)
        sigma, anti_aliased = 0.0, rng.random() < 0.5
    elif scenario == "far":
        height, margin = round(rng.uniform(24, 48)), rng.uniform(11, 16)
    elif scenario == "thin":
        paper, light, sigma, noise = (1.0,) * 3, 0.0, 0.0, 0.0
        ink = (rng.uniform(0.0, 0.75),) * 3  # black to light gray
        thin, height, uneven = True, round(rng.uniform(250, 600)), rng.random() < 0.5
    elif scenario == "thin_small":  # drawn big, a line 1/7 of a 140-px digit, then saved small
        paper, light, sigma, noise, margin = (1.0,) * 3, 0.0, 0.0, 0.0, 0.2
        dark, faint = rng.uniform(0.0, 0.15), rng.uniform(0.42, 0.71)  # 0.42-0.71: 107-181
        ink, thin, height = (dark if rng.random() < 0.5 else faint,) * 3, True, 140
    elif scenario == "faint":  # drawn big, a 1-px line, then redrawn small by faint_pen()
        paper, ink, light, sigma, noise, margin = (1.0,) * 3, (0.0,) * 3, 0.0, 0.0, 0.0, 0.2
        thin, height, opacity = True, 140, rng.uniform(0.16, 0.26)
    elif scenario == "transparent":  # the digit's 20-px box 200 px tall: a canvas about 280 px
        height, margin = 200, 0.2
        ink = rng.choice([(1.0,) * 3, (0.0,) * 3, (0.85, 0.1, 0.1), (0.1, 0.3, 0.9),
                          (0.1, 0.6, 0.2), (1.0, 0.85, 0.1)])  # white, black, red, blue...

    if scenario == "small":
        alpha = small_digit_alpha(digit, height, anti_aliased, rng.uniform(-8, 8))
        ah, aw = alpha.shape
        h, w = side, side + rng.randint(0, side // 4)
        top, left = rng.randint(0, h - ah), rng.randint(0, w - aw)
        full = torch.zeros(h, w)
        full[top:top + ah, left:left + aw] = alpha
        return paint(full, scenario, rng, g, paper, ink, light, sigma, noise, quality, height)
    alpha = digit_alpha(digit, height, rng)
    if thin:
        alpha = skeleton(alpha)
        if scenario == "ballpoint":
            alpha = change_width(alpha, max(0, height // 80))
        if scenario == "thin" and uneven:  # one more pixel to the right: steep lines get 2 px
            alpha = torch.maximum(alpha, F.pad(alpha, (1, 0))[:, :-1])
        if scenario == "thin_small":  # 7 px: one pixel once the 200-odd px picture is 28 or 32
            alpha = change_width(alpha, 3)
        if scenario == "faint":  # two passes more where strokes cross, meet or end: a pass
            alpha = alpha + 2 * 7 * knots(alpha)  # is about 7 px of this line, 1 px saved
    degrees = rng.uniform(-8, 8)  # drawn in a round trip too: the same random numbers follow
    if round_trip:
        degrees, width_change = 0.0, 0 if scenario in KEEP_WIDTH else width_change
    alpha = rotate(change_width(alpha, width_change), degrees)  # also crops to the digit
    ah, aw = alpha.shape
    pad = round(margin * height)
    h, w = ah + 2 * pad + rng.randint(0, pad + 1), aw + 2 * pad + rng.randint(0, pad + 1)
    ## paint() shrinks a tiny picture to a square: in a round trip it is made square first, or
    ## a narrow digit (a 1) comes back stretched sideways, bolder than the original.
    if (round_trip and scenario == "tiny") or scenario in ("thin_small", "faint"):  # square
        h = w = max(h, w)
    top, left = rng.randint(0, h - ah), rng.randint(0, w - aw)
    full = torch.zeros(h, w)
    full[top:top + ah, left:left + aw] = alpha
    if scenario == "faint":
        full = faint_pen(full, rng.choice([28, 32]), opacity)
    return paint(full, scenario, rng, g, paper, ink, light, sigma, noise, quality, height)


def faint_pen(line: torch.Tensor, side: int, opacity: float) -> torch.Tensor:
    """A 1-px line drawn on a big square canvas, redrawn on a side x side one by a light pen:
    each pass over a pixel covers `opacity` of what shows through, and a pixel is passed over
    as often as the line crosses it (a pixel's length of line: one pass), more where `line`
    holds more than 1. Most of the line gets one pass or less; crossings get two more."""
    block = line.shape[0] / side  # big pixels per small one, across
    passes = F.adaptive_avg_pool2d(line[None, None], side)[0, 0] * block
    return 1 - (1 - opacity) ** passes


def small_digit_alpha(digit: torch.Tensor, height: int, anti_aliased: bool,
                      degrees: float) -> torch.Tensor:
    """The digit shrunk so its 20-pixel box is `height` tall: soft edges, or hard 0/1 pixels."""
    x = rotate(digit.float() / 255, degrees)  # cropped to the digit, which MNIST makes 20 px
    size = (max(1, round(x.shape[0] * height / 20)), max(1, round(x.shape[1] * height / 20)))
    x = F.interpolate(x[None, None], size=size, mode="area")[0, 0]
    return x / x.max().clamp(min=1e-6) if anti_aliased else (x > 0.3).float()


def paint(full: torch.Tensor, scenario: str, rng: random.Random, g: torch.Generator, paper,
          ink, light: float, sigma: float, noise: float, quality: int,
          height: int) -> tuple[Image.Image, str]:
    """Lay ink (`full`, 0..1) on paper, light it, blur and noise it; return (image, suffix)."""
    h, w = full.shape
    if scenario == "transparent":
        return transparent(full, ink, rng.choice(["RGBA", "LA", "P"])), ".png"
    canvas = torch.tensor(paper).view(3, 1, 1).expand(3, h, w)
    if scenario not in ("thin", "thin_small", "faint"):  # a paint program's canvas is white
        canvas = canvas * (1 + 0.04 * smooth_noise(h, w, 6, g))
    if scenario in ("grid", "lined"):
        step = rng.randint(max(8, height // 6), max(12, height // 3))
        colour = torch.tensor(rng.choice([(0.6, 0.75, 0.95), (0.7, 0.7, 0.7), (0.55, 0.8, 0.9)]))
        lines = torch.zeros(h, w, dtype=torch.bool)
        offset = rng.randint(0, step - 1)
        lines[offset::step, :] = True
        if scenario == "grid":
            lines[:, offset::step] = True
        canvas = torch.where(lines, colour.view(3, 1, 1), canvas)
    strength = rng.uniform(0.85, 1.0)  # how much ink covers the paper
    canvas = canvas * (1 - strength * full) + torch.tensor(ink).view(3, 1, 1) * strength * full
    canvas = canvas * lighting(h, w, light, rng)
    if scenario == "shadow":
        canvas = canvas * shadow(h, w, rng)
    canvas = blur(canvas, sigma * height / 100)
    canvas = canvas + noise * torch.randn(canvas.shape, generator=g)
    if scenario in ("tiny", "thin_small"):  # shrink the picture to 28 or 32 px, as saved
        side = rng.choice([28, 32])
        canvas = F.interpolate(canvas[None], size=(side, side), mode="area")[0]
    pixels = (canvas.clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).contiguous()
    img = Image.frombytes("RGB", (pixels.shape[1], pixels.shape[0]), pixels.numpy().tobytes())
    if scenario in ("paint", "mouse", "thin", "thin_small", "faint"):
        return img, ".png"
    img.info["quality"] = quality
    return img, ".jpg"


def transparent(full: torch.Tensor, ink, mode: str) -> Image.Image:
    """The ink `full` (0..1) as the alpha channel of a clear canvas, in colour `ink`, in `mode`:
    RGBA; LA (the ink's gray); or P, a palette of the ink at 256 opacities (a transparency
    entry per colour). Clear pixels are black underneath, as a web page's canvas stores them."""
    alpha = (full * 255).round().to(torch.uint8)
    size = (full.shape[1], full.shape[0])
    if mode == "P":
        img = Image.frombytes("P", size, alpha.numpy().tobytes())  # index = opacity
        img.putpalette([round(c * 255) for c in ink] * 256)
        img.info["transparency"] = bytes(range(256))
        return img
    colour = Image.new("RGB", size, tuple(round(c * 255) for c in ink))
    a = Image.frombytes("L", size, alpha.numpy().tobytes())
    colour = Image.composite(colour, Image.new("RGB", size), a.point(lambda v: 255 * (v > 0)))
    img = colour.convert("RGBA") if mode == "RGBA" else colour.convert("L").convert("LA")
    img.putalpha(a)
    return img


def make(args) -> None:
    images, labels = files.load_mnist(args.data_dir, train=False)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rng, g = random.Random(args.seed), torch.Generator().manual_seed(args.seed)
    picks = torch.randperm(len(labels), generator=torch.Generator().manual_seed(args.seed + 1))
    rows = []
    for s, scenario in enumerate(SCENARIOS):
        for i in range(args.per_scenario):
            index = int(picks[s * args.per_scenario + i])
            img, suffix = render(images[index], scenario, rng, g)
            name = f"{scenario}_{i:03d}{suffix}"
            img.save(out / name, quality=img.info.get("quality", 95))
            rows.append((name, scenario, int(labels[index]), index))
        print(f"{scenario}: {args.per_scenario} pictures", flush=True)
    with open(out / "labels.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["file", "scenario", "label", "mnist_test_index"])
        writer.writerows(rows)
    print(f"wrote {len(rows)} pictures and labels.csv to {out}/")


# scoring ----------------------------------------------------------------------------------------
def naive_input(path: Path, mean: float, std: float) -> torch.Tensor:
    """The picture squashed to 28x28 gray, inverted if the paper is light: no real preprocessing."""
    ## RGBA first: Pillow warns of a palette with a transparency entry turned straight to gray
    gray = Image.open(path).convert("RGBA").convert("L").resize((28, 28), Image.BILINEAR)
    x = torch.frombuffer(bytearray(gray.tobytes()), dtype=torch.uint8).view(28, 28).float() / 255
    if x.median() > 0.5:
        x = 1 - x
    return ((x - mean) / std)[None, None]


def score(args) -> None:
    """Accuracy of each checkpoint per scenario, with predict.py's preprocessing and naively."""
    folder = Path(args.images)
    with open(folder / "labels.csv") as f:
        rows = list(csv.DictReader(f))
    models = [(Path(c).stem, *files.load_model(c)) for c in args.checkpoint]
    right = {(name, way): [] for name, _, _ in models for way in ("predict.py", "naive")}
    warned, wrong = [], []
    for r in rows:
        path, label = folder / r["file"], int(r["label"])
        ## exactly what predict.py does
        digit, warning = digit_cleanup.preprocess(digit_cleanup.load_gray(path))
        if warning:
            warned.append(f"{r['file']}: {warning}")
        for name, model, checkpoint in models:
            mean, std = checkpoint["mean"], checkpoint["std"]
            guess = int(predict.classify(model, digit, mean, std, torch.device("cpu")).argmax())
            with torch.inference_mode():
                naive = int(model(naive_input(path, mean, std)).argmax())
            right[name, "predict.py"].append((r["scenario"], guess == label))
            right[name, "naive"].append((r["scenario"], naive == label))
            if guess != label:
                wrong.append(f"{name}: {r['file']} is {label}, predicted {guess}")
    print(f"{len(rows)} pictures in {folder}/; each cell: predict.py / naive 28x28")
    print("| scenario | pictures | " + " | ".join(name for name, _, _ in models) + " |")
    print("|---|---|" + "---|" * len(models))
    for scenario in SCENARIOS + ["all"]:
        cells = []
        for name, _, _ in models:
            rates = [sum(ok for s, ok in right[name, way] if scenario in ("all", s))
                     / sum(1 for s, _ in right[name, way] if scenario in ("all", s))
                     for way in ("predict.py", "naive")]
            cells.append(f"{rates[0]:.1%} / {rates[1]:.1%}")
        count = sum(1 for r in rows if scenario in ("all", r["scenario"]))
        if count:
            label = f"**{scenario}**" if scenario == "all" else scenario
            print(f"| {label} | {count} | " + " | ".join(cells) + " |")
    print(f"\npictures with a no-digit warning: {len(warned)}", *warned[:20], sep="\n")
    if args.errors:
        print(*wrong, sep="\n")


# the MNIST round trip ---------------------------------------------------------------------------
## The clean-up's ground truth: MNIST test digits drawn the way people's pictures arrive (no
## tilt), cleaned up, and compared with themselves. The clean-up should give back the digit it
## was drawn from, as bold as it was: an ink ratio (cleaned / original) of 1, and the same pixels.
def round_trip(images: torch.Tensor, scenario: str, seed: int,
               cleanups: tuple = (digit_cleanup,)) -> list[tuple[torch.Tensor, int]]:
    """Draw each 28x28 uint8 MNIST digit of `images` as a picture of `scenario` (saved in memory
    as make() saves it), then read and clean it up with each of `cleanups` (digit_cleanup
    modules). For each: the 28x28 results, and how many pictures got a warning."""
    rng = random.Random(f"{seed} {scenario}")
    g = torch.Generator().manual_seed(seed)
    cleaned, warned = [[] for _ in cleanups], [0 for _ in cleanups]
    for image in images:
        img, suffix = render(image, scenario, rng, g, round_trip=True)
        saved = io.BytesIO()
        img.save(saved, format="JPEG" if suffix == ".jpg" else "PNG",
                 quality=img.info.get("quality", 95))
        for i, cleanup in enumerate(cleanups):
            digit, warning = cleanup.preprocess(cleanup.load_gray(io.BytesIO(saved.getvalue())))
            cleaned[i].append(digit)
            warned[i] += warning is not None
    return [(torch.stack(digits), count) for digits, count in zip(cleaned, warned)]


def ink_ratios(cleaned: torch.Tensor, originals: torch.Tensor) -> torch.Tensor:
    """Each cleaned digit's ink (the sum of its pixels) over its original's."""
    return cleaned.sum((1, 2)) / originals.sum((1, 2))


def correlations(cleaned: torch.Tensor, originals: torch.Tensor) -> torch.Tensor:
    """The correlation of each cleaned digit's 784 pixels with its original's (1: the same
    picture, up to brightness)."""
    a = cleaned.flatten(1) - cleaned.flatten(1).mean(1, keepdim=True)
    b = originals.flatten(1) - originals.flatten(1).mean(1, keepdim=True)
    return (a * b).sum(1) / (a.norm(dim=1) * b.norm(dim=1)).clamp(min=1e-9)


def width_at_4x(digit: torch.Tensor) -> float:
    """A 28x28 digit's stroke width as the clean-up measures it: at 4x, in the 80-px box, on
    digit_cleanup.strokes()."""
    top, bottom, left, right = digit_cleanup.bounding_box(digit > 0.5)
    big = digit_cleanup.fit(digit[top:bottom, left:right], digit_cleanup.DIGIT_BOX)
    return digit_cleanup.stroke_width(digit_cleanup.strokes(big))


def spread(values: torch.Tensor, digits: int = 2) -> str:
    """The median of `values`, and their 10th to 90th percentile."""
    low, median, high = values.float().quantile(torch.tensor([0.1, 0.5, 0.9])).tolist()
    return f"{median:.{digits}f} ({low:.{digits}f}-{high:.{digits}f})"


def accuracy(model: torch.nn.Module, checkpoint: dict, digits: torch.Tensor,
             labels: torch.Tensor) -> float:
    """The share of 28x28 digits (0..1) that the model reads as their labels."""
    with torch.inference_mode():
        logits = model((digits[:, None] - checkpoint["mean"]) / checkpoint["std"])
    return float((logits.argmax(1) == labels).float().mean())


def widths(args) -> None:
    """MNIST's own stroke widths and ink, which the clean-up's constants come from."""
    for train in (True, False):
        images, _ = files.load_mnist(args.data_dir, train=train)
        digits = images.float() / 255
        found = torch.tensor([width_at_4x(x) for x in digits])
        print(f"MNIST's {len(digits)} {'training' if train else 'test'} digits: stroke width at "
              f"4x, median (10th-90th percentile) {spread(found)}; ink (mean pixel) "
              f"{spread(digits.mean((1, 2)), 3)}; pixels above 0.5: "
              f"{spread((digits > 0.5).sum((1, 2)), 0)}", flush=True)


def trip(args) -> None:
    """The round trip's tables: per scenario, what came back against the MNIST originals."""
    images, labels = files.load_mnist(args.data_dir, train=False)
    versions = [("this clean-up", digit_cleanup)]
    if args.compare_with:  # another version's digit_cleanup.py, on the same pictures
        spec = importlib.util.spec_from_file_location("other_cleanup", args.compare_with)
        versions.append((args.compare_with, importlib.util.module_from_spec(spec)))
        spec.loader.exec_module(versions[1][1])
    model, checkpoint = files.load_model(args.checkpoint)
    picks = torch.randperm(len(labels), generator=torch.Generator().manual_seed(args.seed))
    picks = picks[:args.digits]
    originals, labels = images[picks].float() / 255, labels[picks]
    print(f"{len(picks)} MNIST test digits (seed {args.seed}), drawn in each scenario without "
          f"tilt and cleaned up; {Path(args.checkpoint).stem} reads "
          f"{accuracy(model, checkpoint, originals, labels):.1%} of the originals, whose stroke "
          f"width at 4x is {spread(torch.tensor([width_at_4x(x) for x in originals]))}")
    for group in (KEEP_WIDTH, NEW_WIDTH):
        if group is KEEP_WIDTH:
            print("\n| scenario | clean-up | ink ratio, median (10th-90th) | correlation, median "
                  "| accuracy | warnings |")
        else:  # no width to come back to: the width that comes out, against MNIST's
            print("\n| scenario | clean-up | stroke width at 4x, median (10th-90th) | ink ratio, "
                  "median | accuracy | warnings |")
        print("|---|---|---|---|---|---|")
        for scenario in group:
            cleaned = round_trip(images[picks], scenario, args.seed, [v for _, v in versions])
            for (name, _), (digits, warned) in zip(versions, cleaned):
                ratios = ink_ratios(digits, originals)
                if group is KEEP_WIDTH:
                    cells = [spread(ratios), f"{correlations(digits, originals).median():.3f}"]
                else:
                    inked = [width_at_4x(x) for x in digits if (x > 0.5).any()]
                    cells = [spread(torch.tensor(inked)), f"{ratios.median():.2f}"]
                print(f"| {scenario} | {name} | {' | '.join(cells)} | "
                      f"{accuracy(model, checkpoint, digits, labels):.1%} | {warned} |", flush=True)


HUGE_PICTURE = """
import sys
from PIL import Image, ImageDraw, ImageFont
img = Image.new("RGB", (10000, 10000), (238, 236, 230))
ImageDraw.Draw(img).text((6000, 4000), "3", fill=(30, 30, 40), anchor="mm",
                         font=ImageFont.load_default(size=1500))
img.save(sys.argv[1], compress_level=1)
"""


def speed(args) -> None:
    """Time predict.py's preprocessing of a 4000 x 3000 photo, and its memory on 100 MP."""
    with tempfile.TemporaryDirectory() as tmp:
        photo = Path(tmp) / "photo.jpg"
        img = Image.new("RGB", (4000, 3000), (232, 228, 218))
        ImageDraw.Draw(img).text((2300, 1200), "7", fill=(30, 30, 40), anchor="mm",
                                 font=ImageFont.load_default(size=700))
        img.save(photo, quality=90)
        times = []
        for _ in range(5):
            start = time.perf_counter()
            digit_cleanup.preprocess(digit_cleanup.load_gray(photo))
            times.append(time.perf_counter() - start)
        print(f"4000 x 3000 JPEG photo: read + preprocess, median of 5: "
              f"{sorted(times)[2]:.3f} s")
        huge = Path(tmp) / "huge.png"
        ## Drawn by another process: on Linux a child's peak memory (below) starts from its
        ## parent's, and this process must not hold a 300 MB picture when it starts predict.py.
        subprocess.run([sys.executable, "-c", HUGE_PICTURE, str(huge)], check=True)
        ## Peak memory of a whole predict.py run, including PyTorch itself, in its own process.
        start = time.perf_counter()
        proc = subprocess.Popen([sys.executable, str(REPO / "predict.py"), "--checkpoint",
                                 args.checkpoint, str(huge)], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        out = proc.stdout.read().strip()  # its answer, or its error message
        if hasattr(os, "wait4"):  # Linux, macOS: this child's own peak memory
            _, status, usage = os.wait4(proc.pid, 0)
            code = os.waitstatus_to_exitcode(status)
            ## ru_maxrss is in kilobytes on Linux, in bytes on macOS (`man getrusage`).
            peak = usage.ru_maxrss / (1024 * 1024 if sys.platform == "darwin" else 1024)
            memory = f"peak memory {peak:.0f} MiB"
        else:  # Windows has no wait4
            code = proc.wait()
            memory = "peak memory not measured on this system"
        if code != 0 or not out:  # e.g. no checkpoint yet: a time for a failed run means nothing
            sys.exit(f"predict.py failed on the 100 MP picture: {out or f'exit code {code}'}")
        print(f"10000 x 10000 RGB PNG of a 3 (100 MP): predict.py says '{out.split(': ')[-1]}' "
              f"in {time.perf_counter() - start:.1f} s, {memory}")


def figure(args) -> None:
    """A picture for the README: a few generated photos beside what predict.py made of them."""
    folder = Path(args.images)
    with open(folder / "labels.csv") as f:
        rows = list(csv.DictReader(f))
    chosen = [next(r for r in rows if r["scenario"] == s) for s in args.scenarios]
    tiles = []
    for r in chosen:
        photo = ImageOps.pad(Image.open(folder / r["file"]).convert("RGB"), (112, 112),
                             color=(128, 128, 128))  # the whole picture, as it is
        digit, _ = digit_cleanup.preprocess(digit_cleanup.load_gray(folder / r["file"]))
        tiles.append(pil_to_tensor(photo).float() / 255)
        tiles.append(F.interpolate(digit[None, None], size=(112, 112))[0].expand(3, -1, -1))
    grid = make_grid(torch.stack(tiles), nrow=6, padding=4, pad_value=0.5)
    save_image(grid, args.out)
    print(f"wrote {args.out}: {', '.join(r['file'] for r in chosen)}, each beside the 28x28 "
          "image predict.py made of it")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    m = commands.add_parser("make", help="draw the pictures")
    m.add_argument("--data-dir", default="./data")
    m.add_argument("--out", default="realistic")
    m.add_argument("--per-scenario", type=int, default=100,
                   help=f"pictures per scenario ({len(SCENARIOS)} scenarios)")
    m.add_argument("--seed", type=int, default=0,
                   help="another seed draws another, independent set (a check against tuning "
                        "the preprocessing to one set)")
    s = commands.add_parser("score", help="classify them and report accuracy per scenario")
    s.add_argument("--images", default="realistic")
    s.add_argument("--checkpoint", nargs="+", default=["checkpoints/mnist_mlp.pt"])
    s.add_argument("--errors", action="store_true", help="list the misclassified pictures")
    t = commands.add_parser("speed", help="time a big photo, and memory on a huge picture")
    t.add_argument("--checkpoint", default="checkpoints/mnist_mlp.pt")
    r = commands.add_parser("roundtrip", help="MNIST digits drawn as pictures, cleaned up, "
                            "compared with themselves")
    r.add_argument("--data-dir", default="./data")
    r.add_argument("--checkpoint", default="checkpoints/mnist_mlp.pt")
    r.add_argument("--digits", type=int, default=1000, help="MNIST test digits per scenario")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--compare-with", metavar="FILE",
                   help="another version's digit_cleanup.py, measured on the same pictures")
    w = commands.add_parser("widths", help="MNIST's stroke widths and ink, which the clean-up "
                            "takes its constants from")
    w.add_argument("--data-dir", default="./data")
    g = commands.add_parser("figure", help="draw the README's 'what the model sees' picture")
    g.add_argument("--images", default="realistic")
    g.add_argument("--out", default="docs/what_the_model_sees.png")
    g.add_argument("--scenarios", nargs="+",
                   default=["photo", "ballpoint", "shadow", "grid", "far", "small"])
    args = parser.parse_args()
    {"make": make, "score": score, "roundtrip": trip, "widths": widths, "speed": speed,
     "figure": figure}[args.command](args)


if __name__ == "__main__":
    main()
