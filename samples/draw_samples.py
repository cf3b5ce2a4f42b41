"""Draw the sample pictures in this folder from hand-made pen strokes, with no MNIST in them.

    python samples/draw_samples.py          # rewrites samples/*.png and samples/*.jpg
    python predict.py samples/*.png samples/*.jpg

Each digit is a few strokes written by hand as points in a unit box (x to the right, y down),
then drawn with a pen of some width on some paper. The tests draw their digits the same way,
so what they check does not depend on any one font or on MNIST itself.
"""

import math

from PIL import Image, ImageDraw


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
