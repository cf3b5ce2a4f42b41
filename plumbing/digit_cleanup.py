"""Turn any picture of a handwritten digit into the 28 x 28 image an MNIST model expects.

    from plumbing.digit_cleanup import load_gray, preprocess
    digit, warning = preprocess(load_gray("my_digit.jpg"))  # 28 x 28, 0..1, white on black

A model only knows the kind of images it was trained on. MNIST digits are white on black, about
20x20 pixels inside a 28x28 frame, centred by their centre of mass, with strokes about 2 pixels
wide. preprocess() finds the digit on a small copy of the picture, cuts it out of the full
picture, removes the paper (light, shadows, ruled lines, specks) and gives it MNIST's size,
stroke width and position; a picture with no digit in it gets a warning instead. Top to bottom:
reading a picture, preprocess(), its helpers in the order it calls them, then small tools. It
needs torch and Pillow only: copy it whole. ("Mask": a boolean image, True where there is ink.)
"""

import contextlib
import math
import warnings
from pathlib import Path
from typing import BinaryIO

import torch
import torch.nn.functional as F
from PIL import Image, ImageOps, UnidentifiedImageError

## The clean-up's settings. Pillow warns of pictures over this many pixels, in the whole program,
## as "decompression bombs" (small files that decode to gigabytes), and load_gray() refuses them:
## at Pillow's own 89 MP, a 108-MP phone camera's photos would be refused.
Image.MAX_IMAGE_PIXELS = 120_000_000
MAX_PIXELS = 25_000_000  # bigger pictures are reduced to this as they are read (memory)
OVERVIEW = 640  # the digit is looked for on a copy at most this many pixels across...
DIGIT_BOX = 80  # ...then cut out and scaled so its long side is this: MNIST's 20-px box, 4x
MIN_CONTRAST = 0.08  # ink differs from the paper by this much (0..1) at the least
## A digit is told by its span, its longer side, not its ink (a thin "1" is 2 px wide, 20 tall),
## and it reads even at a third of MNIST's 20 px: ink spanning fewer is a speck.
SPECK_EXTENT = 6
DOT_LENGTH = 3.2  # ink less than this many stroke widths long is a dot, not a digit: is_a_dot()
MAX_ASPECT = 2.5  # wider than this times its height is a number or a word (MNIST's widest: 2.5)
## MNIST's stroke widths, of strokes() in the DIGIT_BOX (4x), on its 60,000 training digits
## (benchmarks/realistic_digits.py widths):
MNIST_WIDTH = 8.0  # the median; strokes outside the usual range are brought to it
MNIST_WIDTHS = (5.9, 11.2)  # the usual range: the 10th to the 90th percentile
## What Pillow raises for EXIF data it cannot parse (a bad header, a truncated tag table).
DAMAGED_EXIF = (OSError, SyntaxError, ValueError, TypeError)


class ImageProblem(Exception):
    """A picture that cannot be read (missing, damaged, too small...); the message says why."""


# reading a picture ---------------------------------------------------------------------------
def load_gray(path: str | Path | BinaryIO) -> torch.Tensor:
    """Read any picture as a float tensor H x W in 0..1 (0 = black), upright; on a clear canvas,
    its alpha channel as dark ink on white.
    `path` is a file's path, or a file object holding its bytes (io.BytesIO(data))."""
    path = Path(path) if isinstance(path, str) else path
    if isinstance(path, Path):
        try:
            if not path.exists():
                raise ImageProblem("no such file")
            if path.is_dir():
                raise ImageProblem("is a directory; pass the image files inside it (dir/*.png)")
            ## A named pipe or a device may never end, and a batch would wait for ever: not
            ## opened, unless it is a pipe this process was given (cat 7.png | ... /dev/stdin).
            if not path.is_file() and not str(path).startswith(("/dev/stdin", "/dev/fd/")):
                raise ImageProblem("is not a regular file (a named pipe, a device or a socket): "
                                   "give a picture file, or pipe one in as /dev/stdin")
            if path.is_file() and path.stat().st_size == 0:  # not a pipe: those have no size
                raise ImageProblem("is empty (0 bytes)")
            if path.suffix.lower() in (".pt", ".pth") and path.is_file():
                raise ImageProblem(f"is a checkpoint, not a picture: did you mean --checkpoint "
                                   f"{path}?")
        except OSError as err:  # a name too long, a folder this user may not enter
            raise ImageProblem(f"cannot be read: {err.strerror or err}") from None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            warnings.simplefilter("ignore", UserWarning)  # Pillow's notes on odd headers
            img = Image.open(path)  # reads only the header: a bomb is refused before decoding
            if img.format == "EPS":  # decoding EPS runs Ghostscript, a PostScript interpreter:
                img.close()  # a picture (uploaded to the page, say) must never run a program
                raise ImageProblem("is PostScript (EPS), which is not read here: save it as "
                                   "PNG or JPEG")
            ## draft(): the JPEG decoder gives gray, and a huge picture at a smaller scale
            ## (far less memory). Other formats ignore it and are reduced below.
            factor = math.ceil(math.sqrt(img.width * img.height / MAX_PIXELS))
            img.draft("L", (img.width // factor, img.height // factor))
            img.load()
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise ImageProblem(f"is refused: over {Image.MAX_IMAGE_PIXELS // 1_000_000} megapixels, "
                           "too many to decode safely") from None
    except UnidentifiedImageError:
        raise ImageProblem("is not an image Pillow can read (PNG, JPEG, BMP, GIF, TIFF, "
                           "WebP...)") from None
    except PermissionError as err:  # the file is there, but this user may not read it
        raise ImageProblem(f"cannot be read: {err.strerror}") from None
    except (OSError, SyntaxError, ValueError) as err:  # Pillow raises all three for damage
        raise ImageProblem(f"is truncated or damaged ({err})") from None
    if max(img.size) < SPECK_EXTENT:
        raise ImageProblem(f"is only {img.width} x {img.height} pixels: too small to hold a digit")
    if img.mode == "LAB":  # a Lab TIFF (Photoshop): its L channel is the lightness, a gray
        img = img.getchannel("L")
    if (factor := math.ceil(math.sqrt(img.width * img.height / MAX_PIXELS))) > 1:
        ## Averaged over factor x factor blocks (for a JPEG, what draft() left to do). reduce()
        ## cannot average 16-bit, palette or 1-bit pixels, or a see-through colour key:
        if img.mode.startswith("I;"):
            img = img.convert("I")  # 16-bit gray as 32-bit, read as such below (key ignored)
        elif img.mode != "I" and ("transparency" in img.info or img.mode in ("P", "PA", "1")):
            img = img.convert("RGBA" if "transparency" in img.info or "P" in img.mode else "L")
        img = img.reduce(factor)  # the last row and column of blocks may be partial
    ## Phones store "rotate me" in the EXIF data instead of rotating; damaged EXIF: as stored.
    with contextlib.suppress(*DAMAGED_EXIF), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # Pillow's "Corrupt EXIF data"
        img = ImageOps.exif_transpose(img)
    if img.mode in ("I;16", "I;16B", "I;16L", "I", "F"):  # 16- or 32-bit or float gray
        x = torch.frombuffer(bytearray(img.convert("F").tobytes()), dtype=torch.float32)
        x = x.view(img.height, img.width).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)  # damaged
        ## The mode does not say the range (some 16-bit files hold 0..255, float ones 0..1 or a
        ## little over): the largest value decides.
        top = x.max()
        return (x / (65535.0 if top > 255 else 255.0 if top > 1.5 else 1.0)).clamp(0, 1)
    if img.mode in ("RGBA", "LA", "PA", "P") or "transparency" in img.info:
        img = img.convert("RGBA")
        alpha = img.getchannel("A")
        low, high = alpha.getextrema()
        ## Ink on a clear canvas (most pixels more than half clear, as drawing pages save it):
        ## where alpha varies, it is the ink, and the colour decides nothing (white would vanish).
        if low < high and sum(alpha.histogram()[:128]) > alpha.width * alpha.height / 2:
            img = ImageOps.invert(alpha)  # dark ink on white paper
        elif low < 255:  # an opaque canvas: its few clear pixels white, as a viewer shows them
            img = Image.alpha_composite(Image.new("RGBA", img.size, "white"), img)
    try:
        gray = img.convert("L")  # also handles CMYK, 1-bit, YCbCr and HSV images
    except ValueError:  # a mode Pillow cannot convert, such as premultiplied "La"
        raise ImageProblem(f"is in colour mode {img.mode}, which Pillow cannot turn into gray: "
                           "save it as PNG or JPEG") from None
    x = torch.frombuffer(bytearray(gray.tobytes()), dtype=torch.uint8).view(gray.height, gray.width)
    return x.float().div_(255)


# turning a picture into an MNIST digit -------------------------------------------------------
## preprocess() is the whole recipe, in the order it runs; each step exists for a kind of picture
## people send. Terms from image processing ("4x": MNIST's 20-px box drawn at 80 px, DIGIT_BOX):
##   block          a square of pixels, wider than a stroke, over which the paper is measured
##   paper level    the paper's brightness under each pixel as if there were no ink; ink is
##                  measured against it, so shadows, uneven light and coloured paper cancel out
##   grain          how much the paper's brightness varies from pixel to pixel (its noise)
##   Otsu's method  the threshold that best splits values into two groups (ink, paper)
##   hysteresis     pixels above a low threshold count where they touch ones above a high one
##   closing        max, then min, over neighbourhoods: a narrow low gap between high values
##                  fills; opening, min then max: high runs shorter than the neighbourhood vanish
##   components     the separate blobs of a mask: pixels that touch (8 neighbours) share one
## PyTorch idioms: F.interpolate, F.*pool2d and F.pad (except with a constant) take batches [N, C,
## H, W]: x[None, None] adds those dimensions, [0, 0] removes them. window_max(x, k) is the maximum
## over each pixel's k x k neighbourhood, -window_max(-x, k) the minimum. unfold cuts a dimension
## into windows; bincount and scatter_reduce gather values by label. A trailing _: in place.


def preprocess(gray: torch.Tensor) -> tuple[torch.Tensor, str | None]:
    """Turn a grayscale picture (H x W, 0..1) into a 28 x 28 MNIST-style digit (white on black),
    and a warning when it holds no digit to read, or more than one (else None)."""
    ## Wrong input is a bug in the calling code, not a fault of the picture: say so.
    wrong = (f"preprocess() takes a gray picture as a float H x W tensor of values from 0 to 1 "
             f"(as load_gray gives), not {gray.dtype} of shape {list(gray.shape)}")
    if gray.dim() != 2 or not gray.is_floating_point() or gray.numel() == 0:
        raise ValueError(wrong)
    ## 2. (Step 1 was load_gray's.) On a small copy (the picture itself when small): is the ink
    ##    darker or lighter than the paper, and where is the digit?
    overview = fit(gray, OVERVIEW) if max(gray.shape) > OVERVIEW else gray
    low, high = torch.aminmax(overview)  # cheap on the small copy; 0..255 values stay far above 1
    if not 0 <= low <= high <= 1:
        raise ValueError(f"{wrong} from {low:g} to {high:g}")
    if already_mnist(gray):  # e.g. an MNIST test image: every step below would only blur it
        return gray.clamp(0, 1), None
    blank = torch.zeros(28, 28)
    block = max(6, max(overview.shape) // 24)  # blocks wider than a stroke, narrower than a shadow
    dark_ink, problem = ink_polarity(overview, block)
    if problem:
        return blank, problem
    marks = ink_mask(ink_map(overview, dark_ink, block))
    mask = keep_digit(marks)  # the digit: no specks, page edges or marks far from it
    if not mask.any():
        return blank, "no digit found: nothing stands out from the paper"
    others = digit_sized(marks & ~mask, mask)  # how many marks left out are digit-sized
    ## 3. Ink and mask again on the digit alone, cut out of the full picture at DIGIT_BOX px:
    ##    a small digit is enlarged before any threshold is chosen, so thin strokes survive.
    crop, scale = cut_out(gray, mask, gray.shape[0] / overview.shape[0], dark_ink)
    ink = ink_map(crop, dark_ink, DIGIT_BOX // 6)  # a sixth of the digit, wider than most strokes
    mask = keep_digit(ink_mask(ink))
    if not mask.any():
        return blank, "no digit found: nothing stands out from the paper"
    top, bottom, left, right = bounding_box(mask)
    extent = max(bottom - top, right - left)
    if extent / scale < SPECK_EXTENT:  # / scale: in the picture's own pixels
        return blank, (f"no digit found: the ink is a speck, {extent / scale:.0f} px across, too "
                       "small to be a digit")
    if is_a_dot(dark_holes_filled(mask, crop, dark_ink)):
        return blank, "no digit found: the ink is a dot, not a digit"
    ## 4. The strokes' ink alone. mnist_strokes() draws where it is at least half the pen's: a
    ## fainter joint, kept in the mask while the digit was found, is left out (as in MNIST's).
    digit = (ink * mask)[top:bottom, left:right]
    return centre_by_mass(mnist_strokes(digit), 28), more_than_one_digit(mask, others)


def already_mnist(gray: torch.Tensor) -> bool:
    """True for a 28 x 28 white-on-black digit that fills about 20 x 20 and is centred by mass."""
    if gray.shape != (28, 28):
        return False
    border = torch.cat([gray[0], gray[-1], gray[:, 0], gray[:, -1]])
    ink = gray > 0.3
    if border.max() > 0.2 or not ink.any() or ink.float().mean() > 0.5:  # not white on black
        return False
    top, bottom, left, right = bounding_box(ink)
    extent = max(bottom - top, right - left)
    total = gray.sum()
    cy = (gray.sum(dim=1) * torch.arange(28)).sum() / total
    cx = (gray.sum(dim=0) * torch.arange(28)).sum() / total
    return bool(16 <= extent <= 22 and abs(cy - 14) <= 1.5 and abs(cx - 14) <= 1.5)


def ink_polarity(x: torch.Tensor, block: int) -> tuple[bool, str | None]:
    """(dark_ink, None): whether the ink is darker than the paper; with no ink, (True, why)."""
    ## Pixels far from the paper, beyond its grain, are ink, on one side. With the side unknown,
    ## the paper is each block's median (right while ink covers under half): hence big blocks.
    residual = x - paper_level(x, max(block, min(x.shape) // 4))
    cut = ink_cut(x)
    darker = (-residual - cut).clamp(min=0).sum()
    lighter = (residual - cut).clamp(min=0).sum()
    if darker == lighter == 0:
        if x.max() - x.min() < MIN_CONTRAST:
            return True, "no digit found: the picture is blank (one uniform colour)"
        return True, ("no digit found: no ink stands out from the paper's grain (noise, or a "
                      "picture too faint)")
    ## Paper is usually the lighter: light ink needs the evidence *and* a dark picture and border
    ## (a white-on-black drawing, a blackboard).
    border = torch.cat([x[0], x[-1], x[:, 0], x[:, -1]])
    light = lighter > darker and x.median() < 0.5 and border.median() < 0.5
    ## Dark marks too: is this "light ink" a shadow's lit side? Smaller blocks follow a shadow.
    if light and darker > 0:
        residual = x - paper_level(x, block)
        light = (residual - cut).clamp(min=0).sum() > (-residual - cut).clamp(min=0).sum()
    return not light, None


def paper_level(x: torch.Tensor, block: int, dark_ink: bool | None = None) -> torch.Tensor:
    """The paper's brightness under every pixel, ink or not, from blocks of the picture
    (`dark_ink`: None while the ink's side is not known)."""
    v = x if dark_ink is not False else 1 - x  # light ink: work on the negative, then undo
    h, w = v.shape
    b = max(2, min(block, h, w))
    ## Pad the right and bottom edges up to whole blocks (-w % b: the pixels missing).
    padded = F.pad(v[None, None], (0, -w % b, 0, -h % b), mode="replicate")[0, 0]
    cells = padded.unfold(0, b, b).unfold(1, b, b).reshape(-1, b * b)  # one row per block
    shape = (padded.shape[0] // b, padded.shape[1] // b)
    if dark_ink is None:
        ## A block's median is the paper while ink covers under half of it. Each block takes the
        ## median of its 3 x 3 neighbours' medians: right too for a block mostly ink among paper.
        grid = neighbours(cells.median(dim=1).values.view(shape)).median(dim=-1).values
    else:
        ## The paper is each block's bright part (its 90th percentile: a noisy pixel can be
        ## brighter). Then a closing on the grid: the brightest neighbour fills blocks inside a
        ## thick stroke, the darkest of those puts a shadow's edge back.
        grid = top_quantile(cells, 0.9, dim=1).view(shape)
        grid = neighbours(neighbours(grid).amax(dim=-1)).amin(dim=-1)
    full = F.interpolate(grid[None, None], size=padded.shape, mode="bilinear")[0, 0][:h, :w]
    return full if dark_ink is not False else 1 - full


def neighbours(grid: torch.Tensor) -> torch.Tensor:
    """For each cell of a 2-D grid, its 3 x 3 neighbourhood (edges repeated): H x W x 9."""
    padded = F.pad(grid[None, None], (1, 1, 1, 1), mode="replicate")[0, 0]
    return padded.unfold(0, 3, 1).unfold(1, 3, 1).reshape(*grid.shape, 9)


def ink_cut(x: torch.Tensor) -> float:
    """How far a pixel must stand out from the paper to be ink: MIN_CONTRAST, or 5 times the
    paper's grain (its pixel-to-pixel noise) if that is more."""
    ## Neighbours' differences cancel slow light; strokes' edges are too few to move the median.
    ## 1.4826 x median(|d|) is a standard deviation, and d has sqrt(2) times a pixel's noise.
    steps = x.flatten().diff().abs()
    grain = 1.4826 * float(steps.median()) / math.sqrt(2) if steps.numel() else 0.0
    return max(MIN_CONTRAST, 5 * grain)


def ink_map(x: torch.Tensor, dark_ink: bool, block: int) -> torch.Tensor:
    """How much ink each pixel holds, 0..1, scaled so that the pen's typical ink is 1."""
    paper = paper_level(x, block, dark_ink)
    if dark_ink:
        ink = (paper - x) / paper.clamp(min=0.1)  # a share of the paper: the same pen in dim light
    else:
        ink = (x - paper) / (1 - paper).clamp(min=0.1)
    ## A pencil is fainter than a marker: among the pixels that stand out from the grain, the
    ## strong group (Otsu's threshold) is the pen, and its 90th percentile becomes 1...
    clear = ink[ink > ink_cut(ink)]
    if clear.numel() == 0:
        return torch.zeros_like(ink)
    threshold = otsu_threshold(clear)
    pen = top_quantile(clear[clear >= threshold], 0.9)
    ## ...unless most of that ink is fainter than the group: a light pen's line, darker only
    ## where it crossed itself, would break into pieces. Then the pen is the strokes' typical ink
    ## along their middle (ridges: at least as inky as both neighbours, across or down), the
    ## strokes being the ink that stands out by 15% of the pen and touches it, not ruled lines.
    if (clear < threshold).float().mean() > 0.5:
        ridges = (ink >= window_max(ink, 1, 3)) | (ink >= window_max(ink, 3, 1))
        strokes = grow(ink >= pen, ink > 0.15 * pen)
        typical = ink[strokes & ~ruled_lines(strokes) & ridges].median()
        pen = typical if typical < threshold else pen  # no ridge: NaN, never less
    return (ink / pen).clamp(0, 1)


def otsu_threshold(values: torch.Tensor) -> float:
    """The cut that best separates two groups of values in 0..1 (Otsu's method, 64 bins)."""
    hist = torch.histc(values.flatten(), bins=64, min=0, max=1)
    centres = (torch.arange(64) + 0.5) / 64
    weight = hist.cumsum(0)  # pixels at or below each cut
    mass = (hist * centres).cumsum(0)  # and the sum of their values
    mean_low = mass / weight.clamp(min=1)
    mean_high = ((hist * centres).sum() - mass) / (weight[-1] - weight).clamp(min=1)
    ## Both groups big and far apart: (pixels below) x (above) x (means' difference)^2, maximal.
    between = weight * (weight[-1] - weight) * (mean_low - mean_high) ** 2
    return float(centres[between.argmax()] + 0.5 / 64)


def ink_mask(ink: torch.Tensor) -> torch.Tensor:
    """Pixels of clear ink, and of faint ink that continues it, without ruled lines."""
    mask = grow(ink > 0.55, ink > 0.4)  # 1 is the pen's ink: clear ink, a little over half
    return mask & ~ruled_lines(mask)  # squared or lined paper


def grow(seeds: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """Grow `seeds` into the connected pixels of `allowed` ("hysteresis" thresholding)."""
    ## A softened stroke fades in places (the top of a 9's loop); lone faint marks stay out.
    labels = components(allowed)
    seeded = torch.zeros(int(labels.max()) + 1, dtype=torch.bool)
    seeded[labels[seeds & allowed]] = True  # allowed pixels: never label 0, the background
    return seeded[labels]


def ruled_lines(mask: torch.Tensor) -> torch.Tensor:
    """Pixels of printed lines that run across the picture (squared or lined paper)."""
    ## A line: a straight run of ink 1/5 of the picture long (smeared a pixel across for a tilt).
    ## A digit's strokes are never this long *and* repeated: only two or more lines are removed.
    small, restore = at_most(mask, 256)
    lines, on_lines = torch.zeros_like(small), [torch.zeros_like(small)] * 2
    for along in (0, 1):  # 0: horizontal lines, 1: vertical lines
        m = (small if along == 0 else small.T).float()
        ## A quick exit: a line fills over 0.6 of its row (full_rows below); with fewer than two
        ## such rows there is no ruled paper, as in most pictures.
        if int((m.mean(dim=1) > 0.6).sum()) < 2:
            continue
        run = max(8, m.shape[1] // 5) | 1  # odd: a run at the edge needs over half of it
        smeared = window_max(m, 3, 1) > 0  # ink, or ink just above or below
        on_line = long_runs(smeared, run) & (m > 0)
        full_rows = on_line.float().mean(dim=1) > 0.6  # rows where a line spans the picture
        ## A line several pixels thick fills neighbouring rows: count each run of rows once.
        separate_lines = (full_rows[1:] & ~full_rows[:-1]).sum() + full_rows[0]
        if separate_lines >= 2:
            ## Spare where a stroke crosses a line (ink 2 px on both sides): the digit stays whole.
            crossing = -window_max(-m, 5, 1) > 0  # the minimum of a 5-pixel column
            found = on_line & full_rows[:, None]
            on_lines[along] = found if along == 0 else found.T  # crossings included
            lines |= on_lines[along] & ~(crossing if along == 0 else crossing.T)
    lines |= on_lines[0] & on_lines[1]  # squared paper: the crossings of two lines are no stroke
    return restore(lines) & mask


def long_runs(mask: torch.Tensor, length: int) -> torch.Tensor:
    """The pixels of each row's runs of True that are at least `length` long; a run that
    touches the left or right edge counts as if it went on for length // 2 beyond it."""
    ## An opening with a 1 x length line, in one pass: runs start and end where the row changes.
    h, w = mask.shape
    steps = F.pad(mask.to(torch.int8), (1, 1)).diff(dim=1)
    rows, first = (steps == 1).nonzero(as_tuple=True)
    last = (steps == -1).nonzero(as_tuple=True)[1] - 1
    reach = (last - first + 1) + length // 2 * ((first == 0).long() + (last == w - 1).long())
    keep = reach >= length
    marks = torch.zeros(h, w + 1, dtype=torch.long)  # +1 where a kept run starts, -1 after it
    marks[rows[keep], first[keep]] = 1
    marks[rows[keep], last[keep] + 1] = -1  # never a start: runs are a pixel apart at least
    return marks.cumsum(dim=1)[:, :w] > 0


def keep_digit(mask: torch.Tensor) -> torch.Tensor:
    """Keep the digit's strokes: the main blob of ink and the pieces close to it."""
    ## Work on a copy at most 128 pixels across: enough to tell blobs apart, and fast.
    small, restore = at_most(mask, 128)
    labels = components(small)
    count = int(labels.max())
    if count == 0:
        return mask
    area, top, bottom, left, right = blobs(labels)
    ## Page edges, the table beyond: a blob covering much of a border line counts little (a
    ## cropped digit touches the border only where strokes end). Each line's share per blob:
    shares = [torch.bincount(line, minlength=count + 1) / len(line)
              for line in (labels[0], labels[-1], labels[:, 0], labels[:, -1])]
    edge_share = torch.stack(shares).amax(dim=0)  # the most of any one border line
    score = area * torch.where(edge_share > 0.4, 0.2, 1.0)
    score[0] = -1
    main = int(score.argmax())
    ## Pieces of the digit (the detached bar of a 5) lie within half a digit of the main blob.
    size = max(bottom[main] - top[main], right[main] - left[main]) + 1
    ## gap: how far each blob's box is from the main blob's (1 side by side, 0 overlapping)
    gap = torch.maximum(torch.maximum(top - bottom[main], top[main] - bottom),
                        torch.maximum(left - right[main], left[main] - right)).clamp(min=0)
    ## However small, a piece close to the strokes is part of a stroke that broke apart (a faint
    ## loop top as a row of dashes): widened by a 32nd of the digit's size, dashes touch.
    k = int(size) // 32 * 2 + 1  # odd: the window that widens
    joined = components(window_max(small.float(), k) > 0) if k > 1 else labels  # 1: as it is
    ## linked: the blobs with pixels (a count above 0) in the main blob's widened region
    linked = torch.bincount(labels[joined == joined[labels == main][0]], minlength=count + 1) > 0
    ## A piece stays if it has 5% of the main blob's area, or is linked, within half a digit (a
    ## chain of specks must not spread over the page); at the border, only if the digit is too.
    touches = edge_share > 0
    keep = ((gap <= size / 2) & ((area >= 0.05 * area[main]) | linked)
            & ~(touches & ~touches[main]))
    keep[0], keep[main] = False, True
    return mask & restore(keep[labels])


def at_most(mask: torch.Tensor, size: int):
    """The mask at most `size` px across (no inked pixel lost), and a function to scale back."""
    scale = size / max(mask.shape)
    if scale >= 1:
        return mask, lambda small: small
    shape = (max(1, round(mask.shape[0] * scale)), max(1, round(mask.shape[1] * scale)))
    small = F.adaptive_max_pool2d(mask.float()[None, None], shape)[0, 0] > 0
    return small, lambda small: F.interpolate(small.float()[None, None], size=mask.shape,
                                              mode="nearest")[0, 0] > 0


def blobs(labels: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """For each label of components(): (area, top, bottom, left, right), each a tensor indexed
    by label (0: the background), with the smallest and largest row and column of its pixels."""
    h, w = labels.shape
    count, flat = int(labels.max()) + 1, labels.flatten()
    ys, xs = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    area = torch.bincount(flat, minlength=count).float()

    def extreme(coords: torch.Tensor, start: int, how: str) -> torch.Tensor:
        return torch.full((count,), start).scatter_reduce(0, flat, coords.flatten(), how)

    return (area, extreme(ys, h, "amin"), extreme(ys, 0, "amax"), extreme(xs, w, "amin"),
            extreme(xs, 0, "amax"))


def components(mask: torch.Tensor) -> torch.Tensor:
    """Label 8-connected regions of a boolean mask: 0 = background, 1, 2, ... = regions."""
    h, w = mask.shape
    ## 1. Runs: the stretches of True pixels in each row (a stroke: a few per row, however long).
    steps = F.pad(mask.to(torch.int8), (1, 1)).diff(dim=1)  # +1: a run starts, -1: it ended
    run_rows, run_firsts = (steps == 1).nonzero(as_tuple=True)
    run_lasts = (steps == -1).nonzero(as_tuple=True)[1] - 1
    rows, first, last = run_rows.tolist(), run_firsts.tolist(), run_lasts.tolist()
    ## 2. Union-find: each run points to a run of its region (itself at first); runs in
    ##    neighbouring rows that touch (corners too) join one region.
    parent = list(range(len(rows)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]  # halve the path on the way: later finds are short
            i = parent[i]
        return i

    ## Runs of row r: row_start[r] to row_start[r + 1] - 1
    row_start = [0] + torch.bincount(run_rows, minlength=h).cumsum(0).tolist()
    for r in range(h - 1):
        i, j = row_start[r], row_start[r + 1]  # walk the runs of rows r and r + 1 together
        while i < row_start[r + 1] and j < row_start[r + 2]:
            if first[j] <= last[i] + 1 and first[i] <= last[j] + 1:  # they touch
                a, b = root(i), root(j)
                parent[max(a, b)] = min(a, b)  # one region (already, if a == b)
            if last[i] < last[j]:  # the run that ends first cannot touch anything further
                i += 1
            else:
                j += 1
    ## 3. Number the regions 1, 2, ... in reading order, and paint the runs: on the pixels in
    ##    reading order (one extra slot at the end), +number where a run starts and -number just
    ##    after it ends; a running sum then gives each run's pixels its number, 0 between runs.
    for i in range(len(parent)):  # each run to its region's root, its first run: always earlier
        parent[i] = parent[parent[i]]
    roots = torch.tensor(parent, dtype=torch.long)
    number = (roots == torch.arange(len(parent))).cumsum(0)[roots]  # each root's rank: 1, 2...
    paint = torch.zeros(h * w + 1, dtype=torch.long)
    paint.index_add_(0, run_rows * w + run_firsts, number)
    paint.index_add_(0, run_rows * w + run_lasts + 1, -number)
    return paint[:-1].cumsum(0).view(h, w)


def digit_sized(left_out: torch.Tensor, digit: torch.Tensor) -> int:
    """How many marks of `left_out` stand beside the digit, about as big: other characters."""
    ## A mark beside the digit on its line (half its rows shared), half the digit's height tall or
    ## more, a quarter of it wide and a quarter of its ink, is a character (a speck is not).
    if not left_out.any():
        return 0
    small, _ = at_most(left_out, 128)  # the same scale for both, as keep_digit() works
    small_digit, _ = at_most(digit, 128)
    top, bottom, left, right = bounding_box(small_digit)
    height, ink = bottom - top, float(small_digit.sum())
    area, tops, bottoms, lefts, rights = blobs(components(small))
    bottoms, rights = bottoms + 1, rights + 1  # slice bounds, as bounding_box() gives them
    h, w = small.shape
    away = (tops > 0) & (lefts > 0) & (bottoms < h) & (rights < w)  # border marks are not
    shared_rows = (bottoms.clamp(max=bottom) - tops.clamp(min=top)).clamp(min=0)  # overlaps
    beside = (rights <= left) | (lefts >= right)
    big = ((bottoms - tops >= height / 2) & (rights - lefts >= height / 4) & (area >= ink / 4)
           & (shared_rows >= (bottoms - tops).clamp(max=height) / 2) & beside & away)
    return int(big[1:].sum())


def cut_out(gray: torch.Tensor, mask: torch.Tensor, factor: float,
            dark_ink: bool) -> tuple[torch.Tensor, float]:
    """The digit that `mask` marks on a copy `factor` times smaller, cut out of `gray` with a
    margin of paper, scaled so its long side is DIGIT_BOX pixels; and that scale."""
    box = bounding_box(mask)
    top, bottom, left, right = (side * factor for side in box)
    size = max(bottom - top, right - left)
    margin = size / 2 + 2  # enough paper around the digit to measure the paper by
    h, w = gray.shape
    crop = gray[max(0, int(top - margin)) : min(h, int(bottom + margin) + 1),
                max(0, int(left - margin)) : min(w, int(right + margin) + 1)]
    scale = DIGIT_BOX / size
    out_size = (max(1, round(crop.shape[0] * scale)), max(1, round(crop.shape[1] * scale)))
    if scale >= 1:  # enlarged smoothly (bicubic), with sharper edges than bilinear would give
        resized = F.interpolate(crop[None, None], size=out_size, mode="bicubic")[0, 0]
        return resized.clamp(0, 1), scale
    ## Shrinking averages cells of pixels. A line thinner than MNIST's usual range (a 1-px pen on
    ## a big canvas) would fade: each cell keeps its inkiest pixel, and mnist_strokes() widens it.
    top, bottom, left, right = box  # on the mask's own box: the strokes' width in the DIGIT_BOX
    width = stroke_width(mask[top:bottom, left:right]) * DIGIT_BOX / max(bottom - top, right - left)
    x = crop if not dark_ink else -crop  # ink is the maximum now
    shrunk = F.adaptive_max_pool2d if width < MNIST_WIDTHS[0] else F.adaptive_avg_pool2d
    resized = shrunk(x[None, None], out_size)[0, 0]
    return (resized if not dark_ink else -resized).clamp(0, 1), scale


def dark_holes_filled(mask: torch.Tensor, gray: torch.Tensor, dark_ink: bool) -> torch.Tensor:
    """The mask with its holes filled if they are dark like its ink: a solid blob made whole."""
    ## paper_level() can take a wide blob's inside for paper: the ring left passes is_a_dot() as
    ## a 0. A real 0's hole is as bright as the paper. Holes: not-ink not reaching the edge.
    outside = components(~mask)
    edges = torch.cat([outside[0], outside[-1], outside[:, 0], outside[:, -1]]).unique()
    holes = ~mask & ~torch.isin(outside, edges)
    if not holes.any():
        return mask
    dark = 1 - gray if dark_ink else gray  # how inky each pixel looks, whichever the ink's side
    ink, paper = float(dark[mask].mean()), float(dark[~mask & ~holes].mean())
    return mask | holes if float(dark[holes].mean()) > (ink + paper) / 2 else mask


def is_a_dot(mask: torch.Tensor) -> bool:
    """Whether the digit's ink is about as long as its strokes are wide: a dot, not a digit."""
    ## A round dot of diameter D has a stroke_width() of D / 2: 2 widths long (up to 2.9 as pixels
    ## draw it). MNIST's digits are longer, but for a few near-solid blobs.
    top, bottom, left, right = bounding_box(mask)
    length = max(bottom - top, right - left)
    if length < 12:  # too few pixels: the outline would be most of the ink, no verdict
        return False
    return length / stroke_width(mask[top:bottom, left:right]) < DOT_LENGTH


def mnist_strokes(digit: torch.Tensor) -> torch.Tensor:
    """Scale the cropped digit into MNIST's 20 x 20 box, with MNIST's stroke width."""
    ## MNIST's digits were black-and-white scans, shrunk into the 20 x 20 box: their grays are
    ## soft edges, not the pen's. So are these: the strokes (ink at least half the pen's) are
    ## drawn black and white at the cut-out's scale (about 4x), their width is set there, and
    ## only then are they resized and averaged 4x4. (Resized first, a 1-px line fades and breaks.)
    scale = DIGIT_BOX / max(digit.shape)  # widths as in the DIGIT_BOX, where MNIST's were measured
    big = F.pad(strokes(digit).float(), (12, 12, 12, 12))  # 1: stroke, 0: paper; room to grow
    width = stroke_width(big) * scale
    ## MNIST's usual widths stay; thinner strokes (a mouse's 1-px line) and thicker ones (a
    ## marker) come to within a pixel of its median, a pixel a side at a time: the maximum over
    ## each 3 x 3 neighbourhood spreads the ink, the minimum thins it.
    if not MNIST_WIDTHS[0] <= width <= MNIST_WIDTHS[1]:
        sign = 1 if width < MNIST_WIDTH else -1  # -max(-x) is the minimum
        for _ in range(DIGIT_BOX):  # a bound only: a few steps reach the median
            if sign * (MNIST_WIDTH - width) <= 1:  # within a pixel of it, or past it
                break
            changed = sign * window_max(sign * big, 3)
            if not changed.any():  # thinned away: keep the last strokes
                break
            big, width = changed, stroke_width(changed) * scale
    if not big.any():  # no stroke at half strength: shrink the digit as it is
        return F.avg_pool2d(fit(digit, DIGIT_BOX)[None, None], 4)[0, 0]
    top, bottom, left, right = bounding_box(big > 0)
    big = fit(big[top:bottom, left:right], DIGIT_BOX)
    h, w = big.shape
    big = F.pad(big, (0, -w % 4, 0, -h % 4))  # whole 4x4 blocks
    return F.avg_pool2d(big[None, None], 4)[0, 0]


def strokes(digit: torch.Tensor) -> torch.Tensor:
    """The strokes: where a digit's ink is at least half the pen's, its 99th percentile (not the
    maximum, which a stray pixel can set, nor 1, which a thin line enlarged may not reach)."""
    return digit > 0.5 * top_quantile(digit.flatten(), 0.99).clamp(min=1e-3)


def stroke_width(mask: torch.Tensor) -> float:
    """Average stroke width in pixels: a stroke of width w and length L covers w x L pixels
    with an outline of about 2 x L, so w = area / (outline / 2). Outline pixels are ink too, so
    a line 1 or 2 px wide reads as 2: measure wider strokes (mnist_strokes works at 4x)."""
    m = F.pad(mask.float(), (1, 1, 1, 1))  # paper all round: strokes at an edge have an outline
    inner = -window_max(-m, 3)  # the pixels whose 8 neighbours are all ink
    outline = (m - inner).sum()
    return float(2 * m.sum() / outline.clamp(min=1))


def centre_by_mass(digit: torch.Tensor, size: int) -> torch.Tensor:
    """Paste `digit` into a size x size black frame with its centre of mass in the middle."""
    h, w = digit.shape
    total = digit.sum().clamp(min=1e-6)
    cy = (digit.sum(dim=1) * torch.arange(h)).sum() / total
    cx = (digit.sum(dim=0) * torch.arange(w)).sum() / total
    top, left = round(size / 2 - cy.item()), round(size / 2 - cx.item())  # MNIST's: 14, 14
    top, left = min(max(top, 0), size - h), min(max(left, 0), size - w)  # stay inside the frame
    out = torch.zeros(size, size)
    out[top : top + h, left : left + w] = digit
    return out


def more_than_one_digit(mask: torch.Tensor, others: int) -> str | None:
    """A warning if the mask looks like a number or a word, or `others` more marks were left out."""
    ## A digit's pieces share columns (a 5's bar above its belly): blobs overlapping in columns
    ## merge. Groups side by side, each at least half the ink's height tall, a quarter of it wide
    ## and with a quarter of the inkiest group's ink, are several characters.
    top, bottom, left, right = bounding_box(mask)
    height = bottom - top
    if (right - left) > MAX_ASPECT * height:
        return (f"the ink is {(right - left) / height:.1f} times wider than tall, wider than "
                "any digit: a number or a word? This reads one digit per picture")
    area, tops, bottoms, lefts, rights = blobs(components(mask))
    pieces = sorted(zip(lefts[1:].tolist(), rights[1:].tolist(), tops[1:].tolist(),
                         bottoms[1:].tolist(), area[1:].tolist()))  # one per blob, left first
    merged = []  # [left, right, top, bottom, ink] of each group of overlapping blobs
    for lf, r, t, b, ink in pieces:
        if merged and lf <= merged[-1][1] + 0.1 * height:  # overlapping, or nearly touching
            last = merged[-1]
            last[1:] = [max(last[1], r), min(last[2], t), max(last[3], b), last[4] + ink]
        else:
            merged.append([lf, r, t, b, ink])
    most_ink = max(column[4] for column in merged)
    marks = others + sum(b + 1 - t >= height / 2 and r + 1 - lf >= height / 4
                         and ink >= most_ink / 4 for lf, r, t, b, ink in merged)
    if marks > 1:
        return (f"{marks} digit-sized marks side by side: a number or a word? This reads one "
                "digit per picture")
    return None


def bounding_box(mask: torch.Tensor) -> tuple[int, int, int, int]:
    """(top, bottom, left, right) of a mask's True pixels (at least one), as slice bounds:
    mask[top:bottom, left:right] holds them all."""
    rows = mask.any(dim=1).nonzero().flatten().tolist()
    cols = mask.any(dim=0).nonzero().flatten().tolist()
    return rows[0], rows[-1] + 1, cols[0], cols[-1] + 1


def fit(x: torch.Tensor, box: int) -> torch.Tensor:
    """Resize so that the longer side is `box` pixels, keeping the aspect ratio; shrinking
    averages areas (a thin stroke fades, where skipping pixels would lose it)."""
    scale = box / max(x.shape)
    size = (max(1, round(x.shape[0] * scale)), max(1, round(x.shape[1] * scale)))
    return F.interpolate(x[None, None], size=size, mode="area" if scale < 1 else "bilinear")[0, 0]


def plain_28x28(gray: torch.Tensor) -> torch.Tensor:
    """For models of other things (Fashion-MNIST): the picture squashed to 28x28, light on dark."""
    small = F.interpolate(gray[None, None], size=(28, 28), mode="area")[0, 0]
    border = torch.cat([small[0], small[-1], small[:, 0], small[:, -1]])
    return 1 - small if border.median() > 0.5 else small


# The results of F.max_pool2d and torch.quantile (the tests check), faster on small tensors ---
def window_max(x: torch.Tensor, height: int, width: int | None = None) -> torch.Tensor:
    """Each pixel's maximum over the height x width window (odd; width defaults to height) centred
    on it, as F.max_pool2d gives it: the maximum of shifted copies, along rows, then columns."""
    width = width or height
    h, w = x.shape
    padded = F.pad(x, (width // 2, width // 2, height // 2, height // 2), value=-math.inf)
    across = padded[:, :w]
    for i in range(1, width):
        across = torch.maximum(across, padded[:, i : i + w])
    out = across[:h]
    for i in range(1, height):
        out = torch.maximum(out, across[i : i + h])
    return out


def top_quantile(x: torch.Tensor, q: float, dim: int = -1) -> torch.Tensor:
    """x.quantile(q, dim) for a high q (0.9, 0.99) and an x without NaN: torch.quantile sorts all
    the values, topk finds the top (1 - q) only."""
    ## The value `rank` places up the sorted values, interpolated between the two around it; rank
    ## as PyTorch 2.14's torch.quantile computes it (q in x's dtype, times n - 1 in double).
    n = x.shape[dim]
    rank = float(torch.tensor(q, dtype=x.dtype)) * (n - 1)
    below = int(rank)
    top = x.topk(n - below, dim=dim).values  # largest first: the last is the value at `below`
    at_below = top.select(dim, n - below - 1)
    next_up = top.select(dim, max(0, n - below - 2))
    return torch.lerp(at_below, next_up, torch.tensor(rank - below, dtype=x.dtype))
