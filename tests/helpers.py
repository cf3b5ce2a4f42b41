"""Plain helper functions that several test modules use (the fixtures are in conftest.py)."""

import csv

from PIL import Image, ImageDraw, ImageFont


def read_csv(path):
    """The rows of a CSV file with a header, as dicts."""
    with open(path) as f:
        return list(csv.DictReader(f))


def digit_picture(digit: int, size=(300, 220), ink=(25, 35, 110), paper=(238, 232, 220),
                  font_size=150, centre=(150, 110)) -> Image.Image:
    """A photo-like picture: a dark digit on light paper, not centred, much bigger than 28x28."""
    img = Image.new("RGB", size, paper)
    font = ImageFont.load_default(size=font_size)
    ImageDraw.Draw(img).text(centre, str(digit), fill=ink, font=font, anchor="mm")
    return img
