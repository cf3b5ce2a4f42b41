"""Data augmentation for `mnist_train.py --augment`: whole batches, on any device.

    from plumbing import augmentation
    for inputs, targets in loader:  # normalised digits, N x 1 x 28 x 28, light ink on dark
        inputs, targets = augmentation.augment(inputs, targets, styles=True)  # digits only
        ...  # the training step, as before

augment() tilts, scales, widens, shifts, thickens or thins each digit its own way; styles=True also
draws strokes that MNIST's writers rarely used. For a DataLoader that loads one sample at a time,
augment the batches it collates (its collate_fn). Augment the training batches only. Needs only
torch.
"""

import math

import torch
import torch.nn.functional as F


def augment(images: torch.Tensor, labels: torch.Tensor,
            styles: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Randomly tilt, scale, widen, shift, and thicken or thin the digits of a normalised batch;
    with styles=True (digits only), add_writing_styles() first marks some 1s, 7s and 9s."""
    ## People's digits lean, sit off-centre and come from other pens than MNIST's: training on
    ## such variations makes the model robust to them. (images, labels) in and out, like
    ## torchvision's v2.MixUp and v2.CutMix: run it before those, which make the labels mixtures.
    if images.dim() != 4 or not images.is_floating_point():
        raise ValueError(f"augment() takes a float batch of shape [N, C, H, W], not "
                         f"{images.dtype} of shape {list(images.shape)}")
    if styles:  # digits only: in Fashion-MNIST, 1, 7 and 9 are trousers, sneakers and boots
        images = add_writing_styles(images, labels)
    n, device, dtype = images.shape[0], images.device, images.dtype

    def uniform(limit):  # n random numbers in [-limit, limit], of the images' dtype: n x 1 x 1
        return ((torch.rand(n, device=device, dtype=dtype) * 2 - 1) * limit).view(-1, 1, 1)

    angle, scale = uniform(math.radians(10)), 1 + uniform(0.1)
    ## The grid says, for every output pixel, where in the input to read it from; grid_sample()
    ## reads there, blending the 4 nearest pixels. Positions run from -1 to 1 across the picture
    ## (align_corners=False: from edge to edge, not centre to centre): on 28 pixels, 1 is 14 px.
    height, width = images.shape[-2:]
    shift_x, shift_y = uniform(2 / (width / 2)), uniform(2 / (height / 2))  # +-2 px

    def centres(size):  # the pixels' centres, -1 + 1/size to 1 - 1/size, as affine_grid has them
        return torch.linspace(-1, 1, size, device=device, dtype=dtype) * (size - 1) / size

    x, y = centres(width).view(1, 1, width), centres(height).view(1, height, 1)
    ## Wider, by 1 to 1.2 times. In MNIST, width tells some digits apart more than it should:
    ## a six as wide as it is tall is rare, a five that wide common, so a model learns "wide: a
    ## 5" and reads people's round sixes as fives. Never narrower: a narrowed 7 looks like a
    ## flagged 1. Each x read from nearer the middle stretches the digit across.
    wider = 1.1 + uniform(0.1)
    x = x / wider
    ## Each image's rotation [[cos, -sin], [sin, cos]], divided by its scale, then its shift,
    ## n x 1 x 1 to broadcast over x (1 x 1 x W) and y (1 x H x 1). The grid maps output to
    ## input, so a scale above 1 reads from nearer the centre: it enlarges the digit.
    cos, sin = torch.cos(angle) / scale, torch.sin(angle) / scale
    ## grid[..., 0] is the x to read from, grid[..., 1] the y. F.affine_grid() makes the same grid
    ## from the 2 x 3 matrices [[cos / wider, -sin, shift_x], [sin / wider, cos, shift_y]], but
    ## slower on a CPU.
    grid = torch.stack([x * cos - y * sin + shift_x, x * sin + y * cos + shift_y], 3)  # n,H,W,2
    ## "border" repeats the edge pixels (paper, in MNIST); "zeros" would fill with 0, lighter than
    ## MNIST's paper once normalised (-0.42): a visible frame. Apple's GPUs lack "border" (issue
    ## pytorch/pytorch#125098): a grid kept on the edge pixels' centres repeats them with "zeros".
    if device.type == "mps":  # (edge in the grid's dtype: grid_sample wants a single one)
        edge = torch.tensor([1 - 1 / width, 1 - 1 / height], device=device, dtype=grid.dtype)
        grid = torch.maximum(torch.minimum(grid, edge), -edge)
    out = F.grid_sample(images, grid, padding_mode="border" if device.type != "mps" else "zeros",
                        align_corners=False)
    ## Stroke width: a 3 x 3 max-pool thickens, a min-pool (minus the max-pool of minus) thins.
    ## 1 in 3 images get each, 1 in 3 neither (`pick`: n x 1 x 1 x 1), mixed with the original to
    ## keep it mild. `thinner` still matches the images picked 2: the first where() skips them.
    thicker, thinner = neighbourhood_max(out), -neighbourhood_max(-out)
    pick = torch.randint(0, 3, (n, 1, 1, 1), device=device)
    out = torch.where(pick == 1, (out + thicker) / 2, out)
    return torch.where(pick == 2, (out + thinner) / 2, out), labels


def neighbourhood_max(images: torch.Tensor) -> torch.Tensor:
    """Each pixel's brightest value among itself and its 8 neighbours, as F.max_pool2d(images, 3,
    stride=1, padding=1) gives but faster on a CPU for small pictures."""
    padded = F.pad(images, (1, 1, 1, 1), value=-math.inf)  # edge pixels meet real ones only
    side = torch.maximum(torch.maximum(padded[..., :-2], padded[..., 1:-1]), padded[..., 2:])
    return torch.maximum(torch.maximum(side[..., :-2, :], side[..., 1:-1, :]), side[..., 2:, :])


def add_writing_styles(images: torch.Tensor, labels: torch.Tensor, p: float = 0.3) -> torch.Tensor:
    """Give some 1s a flag (half of those a foot too), some 7s a bar, some 9s a tail turned left.
    Square pictures, light ink on dark; labels are class indices, on the images' device."""
    ## MNIST's writers were American; much of the world flags its 1 (often with a foot), crosses
    ## its 7 and turns the 9's tail left: a model that never saw those reads a flagged 1 as 7.
    ## p, the chance of a stroke, is low: 1 image in 10 changes, test accuracy within seed noise.
    n, size, device = images.shape[0], images.shape[-1], images.device
    if images.shape[-2] != size:
        raise ValueError(f"the writing styles need square pictures, not {list(images.shape)}")
    chosen = (torch.rand(n, device=device) < p) & ((labels == 1) | (labels == 7) | (labels == 9))
    ## Each picture's own darkest and brightest values, so that any normalisation works.
    low, high = images.amin((1, 2, 3), keepdim=True), images.amax((1, 2, 3), keepdim=True)
    ink = ((images - low) / (high - low).clamp_min(1e-6))[:, 0]  # 0 = paper, 1 = ink
    place = torch.arange(size, device=device, dtype=images.dtype)  # row or column numbers
    inked = ink.sum(2) > 0.5  # n x size: rows with at least half a pixel's worth of ink
    ## Rows without ink become the last row for amin() (the first for amax()): they never win.
    top = torch.where(inked, place, size - 1).amin(1)
    bottom = torch.where(inked, place, 0).amax(1)
    height = (bottom - top).clamp_min(1)
    middle = top + height / 2
    ## Three rows per digit (top, middle, bottom), and in each the ink-weighted mean column,
    ## where its ink is centred. Indices n x 1 (image) and n x 3 (rows) broadcast to n x 3 pairs.
    which = torch.stack([top, middle, bottom], 1).round().long().clamp(0, size - 1)  # n x 3
    picked = ink[torch.arange(n, device=device).view(-1, 1), which]  # n x 3 x size
    x_top, x_mid, x_bottom = ((picked * place).sum(2) / picked.sum(2).clamp_min(1e-6)).unbind(1)
    ## The stroke width: the ink across the middle row, which for a 1 or a 7 crosses its stem.
    ## Where it crosses a 9's loop, or a slanted stroke, it reads wider: hence the cap of 4 px.
    stem = picked[:, 1].sum(1).clamp(1.5, 4)

    def between(a, b):  # n random numbers in [a, b]
        return a + (b - a) * torch.rand(n, device=device, dtype=images.dtype)

    ## One stroke per digit, given by its two ends (x0, y0, x1, y1), picked by the label.
    angle, length = torch.deg2rad(between(20, 55)), height * between(0.2, 0.55)
    flag = (x_top, top, x_top - length * angle.cos(), top + length * angle.sin())  # down, left
    bar_half = height * between(0.12, 0.22)
    bar = (x_mid - bar_half, middle, x_mid + bar_half, middle)
    tail = (x_bottom, bottom, x_bottom - height * between(0.12, 0.25),  # left, a little up
            bottom - height * between(0, 0.12))
    one, seven = labels == 1, labels == 7
    ends = [torch.where(one, f, torch.where(seven, b, t)) for f, b, t in zip(flag, bar, tail)]
    foot_half = height * between(0.15, 0.3)
    foot = (x_bottom - foot_half, bottom, x_bottom + foot_half, bottom)
    footed = one & (torch.rand(n, device=device) < 0.5)
    on = images_to_draw_on(chosen)  # the chosen ones on a CPU, all on a GPU
    strokes = torch.maximum(draw_line(*(v[on] for v in ends), stem[on], size),
                            draw_line(*(v[on] for v in foot), stem[on], size)
                            * footed[on].view(-1, 1, 1))
    strokes = strokes * chosen[on].view(-1, 1, 1)  # nothing for the digits not chosen
    ## Paint the strokes in the picture's own ink colour, where they are brighter than it.
    images = images.clone()  # the caller's batch stays as it was
    images[on] = torch.maximum(images[on], low[on] + strokes[:, None] * (high - low)[on])
    return images


def images_to_draw_on(chosen: torch.Tensor) -> torch.Tensor | slice:
    """Which images to draw strokes on: the chosen ones (about 1 in 10) on a CPU, all on a GPU."""
    ## Drawing is most of the work: a CPU draws the chosen only. A GPU draws all, then masks:
    ## picking them out would make the CPU wait for the GPU, which alone knows how many.
    return chosen.nonzero()[:, 0] if chosen.device.type == "cpu" else slice(None)  # nonzero: k x 1


def draw_line(x0, y0, x1, y1, width: torch.Tensor, size: int) -> torch.Tensor:
    """n anti-aliased lines, one per image: each pixel's ink (0..1), by its distance to the line."""
    ## One number per image per argument, in pixels; pixel centres sit at whole coordinates, y
    ## downwards. The segment's point nearest a pixel is x0 + t * (x1 - x0), t clamped to [0, 1];
    ## the ink fades over one pixel across the line's edge: a 2-px line crosses pixels 0.5, 1, 0.5.
    x0, y0, x1, y1, width = (v.view(-1, 1, 1) for v in (x0, y0, x1, y1, width))
    pixels = torch.arange(size, device=width.device, dtype=width.dtype)
    px, py = pixels.view(1, 1, size), pixels.view(1, size, 1)
    dx, dy = x1 - x0, y1 - y0
    t = (((px - x0) * dx + (py - y0) * dy) / (dx * dx + dy * dy).clamp_min(1e-6)).clamp(0, 1)
    gap_x, gap_y = px - x0 - t * dx, py - y0 - t * dy
    distance = (gap_x * gap_x + gap_y * gap_y).sqrt()
    return (width / 2 + 0.5 - distance).clamp(0, 1)

