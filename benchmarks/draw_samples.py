"""Draw the sample pictures in this folder from hand-made pen strokes, with no MNIST in them.

    python benchmarks/draw_samples.py       # rewrites samples/*.png and samples/*.jpg
    python predict.py samples/*.png samples/*.jpg

Each digit is a few strokes written by hand as points in a unit box (x to the right, y down),
then drawn with a pen of some width on some paper. The tests draw their digits the same way,
so what they check does not depend on any one font or on MNIST itself.
"""

import math
import random
from pathlib import Path

from PIL import Image, ImageDraw, ImageFilter


def arc(cx: float, cy: float, rx: float, ry: float, start: float, end: float,
        steps: int = 24) -> list[tuple[float, float]]:
    """Points along an ellipse, from angle `start` to `end` in degrees (0: right, 90: down)."""
    return [(cx + rx * math.cos(math.radians(start + (end - start) * i / steps)),
             cy + ry * math.sin(math.radians(start + (end - start) * i / steps)))
            for i in range(steps + 1)]


## Each digit: a list of strokes, each a list of (x, y) points in the unit box.
STROKES = {
    0: [arc(0.5, 0.5, 0.32, 0.45, 0, 360, 40)],
    1: [[(0.32, 0.22), (0.55, 0.05), (0.55, 0.95)]],
    2: [arc(0.5, 0.3, 0.3, 0.25, 200, 360) + [(0.75, 0.45), (0.2, 0.95), (0.85, 0.95)]],
    3: [arc(0.48, 0.28, 0.3, 0.23, 200, 450), arc(0.48, 0.72, 0.33, 0.23, 270, 520)],
    4: [[(0.65, 0.95), (0.65, 0.05), (0.15, 0.68), (0.9, 0.68)]],
    5: [[(0.8, 0.05), (0.3, 0.05), (0.25, 0.45)] + arc(0.5, 0.67, 0.32, 0.28, 220, 500)],
    6: [[(0.7, 0.05)] + arc(0.5, 0.68, 0.3, 0.27, 220, 580)],
    7: [[(0.15, 0.05), (0.85, 0.05), (0.4, 0.95)]],
    8: [arc(0.5, 0.27, 0.25, 0.22, 90, 450), arc(0.5, 0.72, 0.3, 0.23, -90, 270)],
    9: [arc(0.5, 0.3, 0.28, 0.25, 0, 360), [(0.78, 0.3), (0.7, 0.95)]],
}


def draw_digit(digit: int, size: tuple[int, int] = (300, 300), height: float = 200,
               centre: tuple[float, float] | None = None, width: int = 8, ink=0, paper=255,
               slant: float = 0.0, angle: float = 0.0, mode: str = "L") -> Image.Image:
    """The digit's strokes drawn `height` pixels tall with a pen `width` pixels wide, leaning
    right by `slant` (0.2: the top is 0.2 x height further right) and turned `angle` degrees
    clockwise."""
    img = Image.new(mode, size, paper)
    cx, cy = centre or (size[0] / 2, size[1] / 2)
    cos, sin = math.cos(math.radians(angle)), math.sin(math.radians(angle))
    draw = ImageDraw.Draw(img)
    for stroke in STROKES[digit]:
        points = []
        for x, y in stroke:
            dx, dy = (x - 0.5 + slant * (0.5 - y)) * 0.8 * height, (y - 0.5) * height
            points.append((cx + dx * cos - dy * sin, cy + dx * sin + dy * cos))
        draw.line(points, fill=ink, width=width, joint="curve")
    return img


def paper(size: tuple[int, int], colour: tuple[int, int, int], rng: random.Random,
          light: float = 0.25) -> Image.Image:
    """Paper of one colour, lit unevenly: each corner a little brighter or darker."""
    corners = Image.new("L", (2, 2))
    corners.putdata([round(255 * (1 - light * rng.random())) for _ in range(4)])
    shade = corners.resize(size, Image.BILINEAR)  # smooth from corner to corner
    return Image.merge("RGB", [Image.eval(shade, lambda v, c=c: v * c // 255) for c in colour])


def samples() -> dict[str, Image.Image]:
    """The sample pictures, by file name: each a digit the way people send them."""
    rng = random.Random(7)  # the same pictures every time
    out = {}
    ## A drawing in a paint program or on predict.py's page: a black marker on white.
    out["drawing_7.png"] = draw_digit(7, size=(280, 280), height=190, width=18, slant=0.1)
    ## A phone photo: blue ballpoint on cream paper, lit unevenly, a little tilted and soft.
    photo = paper((480, 360), (235, 228, 205), rng)
    ink = draw_digit(3, size=(480, 360), height=210, width=9, angle=-6, slant=0.15,
                     centre=(270, 170))
    photo.paste((30, 40, 120), mask=Image.eval(ink, lambda v: 255 - v))  # where the pen went
    out["photo_3.jpg"] = photo.filter(ImageFilter.GaussianBlur(1.2))
    ## Pencil on ruled paper: grey strokes, blue lines running through the digit.
    ruled = paper((400, 300), (246, 246, 240), rng, light=0.1)
    draw = ImageDraw.Draw(ruled)
    for y in range(22, 300, 34):
        draw.line([(0, y), (400, y)], fill=(150, 185, 225), width=2)
    ink = draw_digit(5, size=(400, 300), height=150, width=6, angle=4, centre=(190, 150))
    ruled.paste((95, 95, 100), mask=Image.eval(ink, lambda v: 255 - v))
    out["ruled_5.jpg"] = ruled.filter(ImageFilter.GaussianBlur(0.7))
    ## Chalk on a blackboard: light strokes on dark, the other way round from paper.
    out["chalk_2.png"] = draw_digit(2, size=(300, 240), height=160, width=12, ink=225, paper=40,
                                    angle=3)
    return out


def main() -> None:
    folder = Path(__file__).resolve().parent.parent / "samples"
    for name, img in samples().items():
        img.save(folder / name, quality=85, optimize=True)
        print(f"wrote {folder / name} ({(folder / name).stat().st_size // 1024} kB)")


if __name__ == "__main__":
    main()
