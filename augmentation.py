"""Data augmentation for `mnist_train.py --augment`: whole batches, on any device.

    import augmentation
    for inputs, targets in loader:  # normalised digits, N x 1 x 28 x 28, light ink on dark
        inputs, targets = augmentation.augment(inputs, targets, styles=True)  # digits only
        ...  # the training step, as before

augment() tilts, scales and shifts every digit of a batch, and thickens or thins two in three,
each with its own random numbers. With styles=True, for digits only, add_writing_styles() first
draws a few strokes that MNIST's writers rarely used (a flag on a 1, a bar on a 7, a tail turned
left on a 9): on other data, where 1, 7 and 9 are other classes, leave it off.
collate_and_augment() does the same for a DataLoader that loads one sample at a time:
DataLoader(dataset, 64, collate_fn=functools.partial(augmentation.collate_and_augment,
styles=True)), a partial rather than a lambda, so that worker processes can receive it.
Augment the training batches only: validate and test on the pictures as they are.
mnist_train.py imports this module; you can copy it into a project of your own: it needs
only torch.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.utils.data import default_collate


def augment(images: torch.Tensor, labels: torch.Tensor,
            styles: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Randomly tilt, scale, shift, and thicken or thin the digits of a normalised batch.

    With styles=True (digits only), add_writing_styles() first draws a flag, bar or tail on
    some 1s, 7s and 9s.
    """
    ## Digits in people's pictures lean, sit a little off-centre after cropping, and come from
    ## thinner or thicker pens than MNIST's. Training on such variations makes the model robust
    ## to them. One call warps the whole batch, each image with its own random numbers,
    ## wherever the batch lives, GPU included. (On a 2-core CPU it still takes about 2.5x as
    ## long as the small MLP's training steps, and a sixth of the CNN's.)
    ## It takes (images, labels) and returns both, the way torchvision's batch transforms are
    ## called (v2.MixUp, v2.CutMix); unlike those, it returns the labels as they came. It needs
    ## them as class indices, so run it before those two, which turn them into mixtures.
    if images.dim() != 4 or not images.is_floating_point():
        raise ValueError(f"augment() takes a float batch of shape [N, C, H, W], not "
                         f"{images.dtype} of shape {list(images.shape)}")
    if styles:  # digits only: in Fashion-MNIST, 1, 7 and 9 are trousers, sneakers and boots
        images = add_writing_styles(images, labels)
    n, device, dtype = images.shape[0], images.device, images.dtype

    def uniform(limit):  # n random numbers in [-limit, limit], of the images' own dtype
        return (torch.rand(n, device=device, dtype=dtype) * 2 - 1) * limit

    angle, scale = uniform(math.radians(10)), 1 + uniform(0.1)
    ## The grid says, for every output pixel, where in the input to read it from; grid_sample()
    ## reads there, blending the 4 nearest pixels. Positions run from -1 to 1 across the
    ## picture, so on 28 pixels one unit is 14 px. (align_corners=False, here and in
    ## grid_sample(): -1 and 1 are the outer edges of the edge pixels, not their centres.)
    height, width = images.shape[-2:]
    shift_x, shift_y = uniform(2 / (width / 2)), uniform(2 / (height / 2))  # +-2 px

    def centres(size):  # the pixels' centres, -1 + 1/size to 1 - 1/size, as affine_grid has them
        return torch.linspace(-1, 1, size, device=device, dtype=dtype) * (size - 1) / size

    x, y = centres(width).view(1, 1, width), centres(height).view(1, height, 1)
    ## Each image's tilt and size: a rotation [[cos, -sin], [sin, cos]], divided by its scale,
    ## and then its shift. The grid maps output to input, so a scale above 1 reads from nearer
    ## the centre: it enlarges the digit. Each number is shaped n x 1 x 1, to broadcast over the
    ## positions x (1 x 1 x W) and y (1 x H x 1).
    cos, sin = (torch.cos(angle) / scale).view(-1, 1, 1), (torch.sin(angle) / scale).view(-1, 1, 1)
    shift_x, shift_y = shift_x.view(-1, 1, 1), shift_y.view(-1, 1, 1)
    ## grid[..., 0] holds the x to read from and grid[..., 1] the y, the order grid_sample()
    ## wants. F.affine_grid(theta, shape) makes this grid too (to the last bit on an AMD CPU,
    ## within one rounding step on an Intel one), from n 2 x 3 matrices theta = [[cos, -sin,
    ## shift_x], [sin, cos, shift_y]] (the cos and sin above), but on a CPU it takes 3x as long
    ## for 28-px pictures.
    grid = torch.stack([x * cos - y * sin + shift_x, x * sin + y * cos + shift_y], 3)  # n,H,W,2
    ## "border" repeats the edge pixels, which in MNIST are paper (its digits were fitted into
    ## the middle 20x20). "zeros" would fill with 0, which after normalising is lighter than
    ## MNIST's black paper (-0.42): a visible frame. Apple's GPUs lack "border"
    ## (pytorch/pytorch#125098): there, keep the grid on the edge pixels' centres, so that
    ## "zeros" gives the zero-padding no weight and each read repeats an edge pixel instead.
    if device.type == "mps":
        edge = torch.tensor([1 - 1 / images.shape[3], 1 - 1 / images.shape[2]], device=device,
                            dtype=grid.dtype)  # float16 stays float16: grid_sample wants one type
        grid = torch.maximum(torch.minimum(grid, edge), -edge)
    out = F.grid_sample(images, grid, padding_mode="border" if device.type != "mps" else "zeros",
                        align_corners=False)
    ## Stroke width: a 3 x 3 max-pool spreads ink to neighbours (thicker), a min-pool removes
    ## edge pixels (thinner; PyTorch has no min-pool, so it is minus the max-pool of minus). Each
    ## image has a 1 in 3 chance of each, and of neither: `pick` holds one number per image,
    ## shaped n x 1 x 1 x 1 so that it broadcasts over the pixels. Mixing with the original
    ## keeps it mild.
    thicker, thinner = neighbourhood_max(out), -neighbourhood_max(-out)
    pick = torch.randint(0, 3, (n, 1, 1, 1), device=device)
    out = torch.where(pick == 1, (out + thicker) / 2, out)
    ## The images picked 2 came through the line above unchanged, so `thinner`, made before it,
    ## still matches them.
    return torch.where(pick == 2, (out + thinner) / 2, out), labels


def neighbourhood_max(images: torch.Tensor) -> torch.Tensor:
    """Each pixel's brightest value among itself and its 8 neighbours: F.max_pool2d(images, 3,
    stride=1, padding=1), computed as the maximum of shifted copies."""
    ## The same numbers as max_pool2d, which on a CPU is slow for such small pictures: 0.7 ms
    ## for 64 MNIST digits, against 0.1 ms here. A 3 x 3 maximum is the maximum of 3 pixels side
    ## by side, then of 3 such results one above the other. Padding with -inf makes the edge
    ## pixels compare only with real ones.
    padded = F.pad(images, (1, 1, 1, 1), value=-math.inf)
    side = torch.maximum(torch.maximum(padded[..., :-2], padded[..., 1:-1]), padded[..., 2:])
    return torch.maximum(torch.maximum(side[..., :-2, :], side[..., 1:-1, :]), side[..., 2:, :])


def add_writing_styles(images: torch.Tensor, labels: torch.Tensor, p: float = 0.3) -> torch.Tensor:
    """Give some 1s a flag (half of those a foot too), some 7s a bar, some 9s a tail turned left.

    labels are class indices, on the same device as images.
    """
    ## MNIST's writers were American. Much of the world writes 1 with a flag and often a foot,
    ## crosses its 7 so that it is not read as that 1, and turns the 9's tail to the left. A
    ## model that never saw those reads a flagged 1 as 7 (README, "Real pictures"). Each stroke
    ## starts at the digit's own top, middle or bottom, as wide as its stem. p is the chance that
    ## a 1, 7 or 9 gets its stroke: about 1 image in 10 changes, the rest stay as MNIST wrote
    ## them. (A flag on half the 1s cost the MLP 0.2 points of MNIST test accuracy over 6 seeds;
    ## p = 0.3 costs less than the spread from seed to seed.) Square pictures, light ink on dark.
    n, size, device = images.shape[0], images.shape[-1], images.device
    if images.shape[-2] != size:
        raise ValueError(f"the writing styles need square pictures, not {list(images.shape)}")
    chosen = (torch.rand(n, device=device) < p) & ((labels == 1) | (labels == 7) | (labels == 9))
    ## Each picture's own darkest and brightest values, so that any normalisation works.
    low, high = images.amin((1, 2, 3), keepdim=True), images.amax((1, 2, 3), keepdim=True)
    ink = ((images - low) / (high - low).clamp_min(1e-6))[:, 0]  # 0 = paper, 1 = ink
    place = torch.arange(size, device=device, dtype=images.dtype)  # row or column numbers
    inked = ink.sum(2) > 0.5  # n x size: rows with at least half a pixel's worth of ink
    ## The first inked row is the smallest row number among the inked ones: where() puts the
    ## largest possible row in place of every row without ink, so they never win amin().
    top = torch.where(inked, place, size - 1).amin(1)
    bottom = torch.where(inked, place, 0).amax(1)
    height = (bottom - top).clamp_min(1)
    middle = top + height / 2
    ## Three rows per digit (top, middle, bottom), and in each, the column where its ink is
    ## centred: the ink-weighted mean of the column numbers.
    which = torch.stack([top, middle, bottom], 1).round().long().clamp(0, size - 1)  # n x 3
    ## Two index tensors, n x 1 (the image) and n x 3 (its row), broadcast to n x 3 pairs.
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
    in_ink = low[on] + strokes[:, None] * (high - low)[on]
    images[on] = torch.maximum(images[on], in_ink)
    return images


def images_to_draw_on(chosen: torch.Tensor) -> torch.Tensor | slice:
    """Which images to draw strokes on: the chosen ones on a CPU, all of them on a GPU."""
    ## Only the chosen digits, about 1 in 10, get a stroke, and drawing is most of
    ## add_writing_styles()'s work: on a CPU, drawing only theirs halves its time. On a GPU,
    ## picking them out would make the CPU wait for the GPU at every batch (how many were chosen
    ## decides the size of the result, and only the GPU knows it): there, every digit's stroke
    ## is drawn, then masked. Either way, images[result] are the images to draw on. (nonzero()
    ## gives one row [i] per True entry, a k x 1 tensor; [:, 0] makes it a plain list of k.)
    return chosen.nonzero()[:, 0] if chosen.device.type == "cpu" else slice(None)


def draw_line(x0, y0, x1, y1, width: torch.Tensor, size: int) -> torch.Tensor:
    """n anti-aliased lines, one per image: each pixel's ink (0..1), from how far it is from
    the line."""
    ## Every argument holds one number per image, in pixels; a pixel's centre sits at whole
    ## coordinates, y growing downwards. The point of the segment nearest a pixel is
    ## x0 + t * (x1 - x0) with t clamped to [0, 1]. The ink fades from full to none over one
    ## pixel, centred on the line's edge at width / 2: full within width / 2 - 0.5, half at
    ## width / 2 (a 2-px line crosses the pixels 0.5, 1, 0.5), none beyond width / 2 + 0.5.
    x0, y0, x1, y1, width = (v.view(-1, 1, 1) for v in (x0, y0, x1, y1, width))
    pixels = torch.arange(size, device=width.device, dtype=width.dtype)
    px, py = pixels.view(1, 1, size), pixels.view(1, size, 1)
    dx, dy = x1 - x0, y1 - y0
    t = (((px - x0) * dx + (py - y0) * dy) / (dx * dx + dy * dy).clamp_min(1e-6)).clamp(0, 1)
    gap_x, gap_y = px - x0 - t * dx, py - y0 - t * dy
    distance = (gap_x * gap_x + gap_y * gap_y).sqrt()
    return (width / 2 + 0.5 - distance).clamp(0, 1)


def collate_and_augment(samples: list,
                        styles: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """DataLoader collate_fn for --augment: stack the samples, then augment the batch."""
    return augment(*default_collate(samples), styles=styles)
