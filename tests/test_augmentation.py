"""augmentation.py: what --augment does to a batch, and that it touches training batches only."""

import math

import pytest
import torch
import torch.nn.functional as F
from helpers import standardised

import common
import mnist_train
from plumbing import augmentation, files


@pytest.fixture
def tiny_fashion(tiny_mnist, tmp_path):
    """A data folder with FashionMNIST/raw/: the tiny digits, standing in for clothes."""
    import shutil

    shutil.copytree(tiny_mnist / "MNIST", tmp_path / "fdata" / "FashionMNIST")
    return tmp_path / "fdata"


def centre_of_mass(img):
    """(row, column) centre of mass of a 28x28 image whose background is 0."""
    total = img.sum()
    return ((img.sum(1) * torch.arange(28)).sum() / total,
            (img.sum(0) * torch.arange(28)).sum() / total)


def test_augment_varies_digits_mildly_and_keeps_them_digits(tiny_mnist):
    images, labels = files.load_mnist(tiny_mnist, train=True)
    x = standardised(images[:300], common.MNIST_MEAN, common.MNIST_STD)
    torch.manual_seed(0)
    out, out_labels = augmentation.augment(x, labels[:300], styles=True)
    assert out.shape == x.shape and out.dtype == x.dtype
    assert torch.equal(out_labels, labels[:300])  # the labels pass through unchanged
    ## no new values: warping and pooling only move and mix existing intensities
    background = x.min()
    assert out.min() >= background - 1e-5 and out.max() <= x.max() + 1e-5
    assert torch.allclose(out[:, :, 0, 0], background.expand(300))  # no dark frame
    ink_in, ink_out = (x - background).sum((1, 2, 3)), (out - background).sum((1, 2, 3))
    ratio = ink_out / ink_in
    ## some strokes got thicker, some thinner, none vanished or blew up
    assert (ratio > 1.15).any() and (ratio < 0.85).any()
    assert ratio.min() > 0.4 and ratio.max() < 2.5
    ## every image changed, but its centre moved by at most a few pixels
    assert ((out - x).abs().amax((1, 2, 3)) > 0.1).all()
    for before, after in zip(x[:, 0] - background, out[:, 0] - background):
        shift = torch.stack(centre_of_mass(before)) - torch.stack(centre_of_mass(after))
        assert shift.abs().max() < 3.5
    ## the same seed gives the same augmentation
    torch.manual_seed(0)
    assert torch.equal(augmentation.augment(x, labels[:300], styles=True)[0], out)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_augment_works_in_the_batch_s_own_dtype(dtype):
    ## augmentation.py is meant to be copied: a half-precision or double batch must work too
    ## (the random numbers take the batch's dtype, or grid_sample would refuse the mix).
    x = stem_picture(4).to(dtype)
    out, _ = augmentation.augment(x, torch.tensor([1, 7, 9, 0]), styles=True)
    assert out.dtype == dtype and out.shape == x.shape and torch.isfinite(out).all()


def test_augment_copied_for_other_data_draws_no_digit_strokes_and_refuses_odd_batches():
    ## In CIFAR-10, class 1 is a car: the writing styles are opt-in (styles=True), for digits.
    x = torch.rand(64, 3, 32, 24)
    labels = torch.ones(64, dtype=torch.long)
    torch.manual_seed(0)
    default, _ = augmentation.augment(x, labels)
    torch.manual_seed(0)
    assert torch.equal(default, augmentation.augment(x, labels, styles=False)[0])
    with pytest.raises(ValueError, match=r"need square pictures, not \[64, 3, 32, 24\]"):
        augmentation.augment(x, labels, styles=True)
    with pytest.raises(ValueError, match=r"a float batch of shape \[N, C, H, W\], not "
                       r"torch.float32 of shape \[64, 32, 24\]"):
        augmentation.augment(x[:, 0], labels)
    with pytest.raises(ValueError, match="not torch.uint8"):
        augmentation.augment((x * 255).to(torch.uint8), labels)


def test_augment_shifts_by_at_most_2_pixels_whatever_the_picture_s_size():
    ## A copy used on 56 x 56 pictures shifts them by +-2 px too, not by +-4 (which is 2/28 of
    ## the width). A 2x2 dot at the centre stays there under tilt, scale and widening: only the
    ## shift moves its centre of mass (by up to 2 px times the scale and the widening, 1.1 and
    ## 1.2 at most, which the tilt shares between the two directions).
    torch.manual_seed(0)
    x = torch.zeros(400, 1, 56, 56)
    x[:, :, 27:29, 27:29] = 1
    out, _ = augmentation.augment(x, torch.zeros(400, dtype=torch.long), styles=False)
    rows = torch.arange(56.0)
    mass = out[:, 0].sum((1, 2))
    dy = (out[:, 0].sum(2) * rows).sum(1) / mass - 27.5
    dx = (out[:, 0].sum(1) * rows).sum(1) / mass - 27.5
    assert dx.abs().max() <= 2.7 and dy.abs().max() <= 2.7  # was 4.5
    assert dx.abs().max() > 1.5 and dy.abs().max() > 1.5  # the whole range is used


def test_augment_makes_digits_wider_never_narrower():
    ## A bar across and a bar upright, 400 times each: the bar across comes out longer by the
    ## widening (1 to 1.2 times), the upright one keeps its length on average (the scale is
    ## 0.9 to 1.1; thickening strokes lengthens both a little).
    across, upright = torch.zeros(400, 1, 28, 28), torch.zeros(400, 1, 28, 28)
    across[:, :, 13:15, 6:22], upright[:, :, 6:22, 13:15] = 1, 1

    def length(images, dim):  # the ink's spread along one axis: its standard deviation
        ink = images[:, 0].sum(dim)
        place = torch.arange(28.0)
        mean = (ink * place).sum(1) / ink.sum(1)
        return ((ink * (place - mean[:, None]) ** 2).sum(1) / ink.sum(1)).sqrt()

    labels = torch.zeros(400, dtype=torch.long)
    ## The same random numbers for both calls: each bar across has a twin upright with the same
    ## tilt, scale, shift, widening and pen, so the two compare picture by picture. An average
    ## alone would let a widening of 0.9 to 1.3 times pass.
    torch.manual_seed(0)
    grown_across = length(augmentation.augment(across, labels)[0], 1) / length(across, 1)
    torch.manual_seed(0)
    grown_upright = length(augmentation.augment(upright, labels)[0], 2) / length(upright, 2)
    assert 0.98 < grown_upright.mean() < 1.05
    widened = grown_across / grown_upright  # 1 to 1.2, give or take the pixels' rounding
    assert widened.min() > 0.98 and widened.max() < 1.25
    assert 1.07 < widened.mean() < 1.13


@pytest.mark.parametrize("shape", [(5, 1, 28, 28), (2, 3, 7, 9)])
def test_neighbourhood_max_is_a_3x3_max_pool(shape):
    x = torch.randn(shape)
    assert torch.equal(augmentation.neighbourhood_max(x), F.max_pool2d(x, 3, stride=1, padding=1))


@pytest.mark.parametrize("shape", [(64, 1, 28, 28), (8, 1, 40, 32)])
def test_augment_warps_as_affine_grid_and_max_pool2d_would(shape):
    ## augment() writes out the grid and the 3x3 max-pool for speed. The textbook version,
    ## drawing the same random numbers in the same order, must give the same pictures. In
    ## float64: in float32, affine_grid's matrix product rounds about 1 grid entry in 8 one step
    ## differently on an Intel Xeon (equal to the last bit on an AMD EPYC), which moves randn
    ## pixels by up to 1.5e-5; in float64 the two ways differ by 2e-14 at most, and a wrong sign,
    ## axis or shift would still move values by about 1.
    x, n = torch.randn(shape, dtype=torch.float64), shape[0]

    def uniform(limit):  # augment() draws its random numbers in the images' dtype
        return (torch.rand(n, dtype=torch.float64) * 2 - 1) * limit

    torch.manual_seed(0)
    angle, scale = uniform(math.radians(10)), 1 + uniform(0.1)
    shift_x, shift_y = uniform(2 / (shape[3] / 2)), uniform(2 / (shape[2] / 2))
    wider = 1.1 + uniform(0.1)
    cos, sin = torch.cos(angle) / scale, torch.sin(angle) / scale
    theta = torch.stack([torch.stack([cos / wider, -sin, shift_x], 1),
                         torch.stack([sin / wider, cos, shift_y], 1)], 1)
    grid = F.affine_grid(theta, list(shape), align_corners=False)
    out = F.grid_sample(x, grid, padding_mode="border", align_corners=False)
    thicker, thinner = F.max_pool2d(out, 3, 1, 1), -F.max_pool2d(-out, 3, 1, 1)
    pick = torch.randint(0, 3, (n, 1, 1, 1))
    out = torch.where(pick == 1, (out + thicker) / 2, out)
    expected = torch.where(pick == 2, (out + thinner) / 2, out)
    torch.manual_seed(0)
    assert torch.allclose(augmentation.augment(x, torch.zeros(n))[0], expected, rtol=0, atol=1e-9)


def test_writing_styles_draw_the_same_strokes_the_gpu_way(monkeypatch):
    ## On a CPU only the chosen digits are drawn on; on a GPU all are, then masked. Both ways
    ## must paint the same pictures, and leave the caller's batch as it was.
    x = torch.randn(256, 1, 28, 28)
    labels = torch.tensor([1, 7, 9, 0]).repeat(64)
    before = x.clone()
    torch.manual_seed(0)
    cpu_way = augmentation.add_writing_styles(x, labels)
    monkeypatch.setattr(augmentation, "images_to_draw_on", lambda chosen: slice(None))
    torch.manual_seed(0)
    assert torch.equal(augmentation.add_writing_styles(x, labels), cpu_way)
    assert torch.equal(x, before) and not torch.equal(cpu_way, x)


def stem_picture(n: int) -> torch.Tensor:
    """n normalised 28x28 pictures of a plain 1: a vertical stroke 2 px wide, rows 4 to 23."""
    ink = torch.zeros(n, 1, 28, 28)
    ink[:, :, 4:24, 13:15] = 1
    return (ink - common.MNIST_MEAN) / common.MNIST_STD


def test_writing_styles_add_a_flag_and_foot_to_1s_a_bar_to_7s_a_tail_to_9s():
    x = stem_picture(40)
    labels = torch.tensor([1, 7, 9, 0, 4] * 8)
    torch.manual_seed(0)
    out = augmentation.add_writing_styles(x, labels, p=1.0)
    background = x.min()
    ## ink is only added, never brighter than the digit's own, never to other digits
    assert (out >= x).all() and torch.allclose(out.amax((1, 2, 3)), x.amax((1, 2, 3)))
    others = (labels == 0) | (labels == 4)
    assert torch.equal(out[others], x[others])
    added = (out - x)[:, 0] > 0.5 * (x.max() - background)  # n x 28 x 28: new ink
    left, right = added[:, :, :13], added[:, :, 15:]
    for i, label in enumerate(labels.tolist()):
        rows = added[i].any(1).nonzero().flatten()
        if label == 1:  # a flag from the top, down to the left: the 1 that European hands write
            assert left[i, 4:7].any() and not right[i, :20].any()
            assert left[i].sum() >= 4 and rows.min() >= 4
        if label == 7:  # a bar across the middle of the stem, on both sides
            assert left[i, 11:17].any() and right[i, 11:17].any()
            assert rows.min() >= 11 and rows.max() <= 16
        if label == 9:  # the tail's end turns left
            assert left[i, 19:24].any() and not right[i].any() and rows.min() >= 18
    ## some 1s get a foot as well: ink to the right of the stem at its bottom
    ones = labels == 1
    assert 0 < right[ones, 21:24].any(2).any(1).sum() < ones.sum()
    ## p is the share of those digits that get a stroke: p=0 changes nothing
    assert torch.equal(augmentation.add_writing_styles(x, labels, p=0.0), x)
    torch.manual_seed(1)
    some = augmentation.add_writing_styles(x.repeat(10, 1, 1, 1), labels.repeat(10), p=0.3)
    changed = (some != x.repeat(10, 1, 1, 1)).flatten(1).any(1).float().mean()
    assert 0.1 < changed < 0.26  # 3 of 5 labels can get a stroke: 0.6 * 0.3 = 0.18


@pytest.mark.parametrize("dataset", ["mnist", "fashion-mnist"])
def test_augment_touches_training_batches_only_and_draws_styles_on_digits_only(
        tiny_mnist, tmp_path, dataset, monkeypatch, request):
    ## Validation and test pictures are judged as they are. Fashion-MNIST's 1, 7 and 9 are
    ## trousers, sneakers and ankle boots: no flags on those.
    calls, real = [], augmentation.augment
    monkeypatch.setattr(augmentation, "augment", lambda images, labels, styles=False: (
        calls.append((len(labels), styles)) or real(images, labels, styles)))
    data = tiny_mnist if dataset == "mnist" else request.getfixturevalue("tiny_fashion")
    assert mnist_train.main(["--data-dir", str(data), "--augment", "--dataset", dataset,
                             "--val-size", "200", "--batch-size", "100", "--epochs", "2",
                             "--save-path", str(tmp_path / "m.pt")]) == 0
    assert calls == [(100, dataset == "mnist")] * 12  # 600 training pictures, twice
