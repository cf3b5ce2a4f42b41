import json
import re

import pytest
import torch
import torch.nn.functional as F
from helpers import digit_picture
from PIL import Image

import predict


def centre_of_mass(x):
    total = x.sum()
    return ((x.sum(1) * torch.arange(28)).sum() / total).item(), \
        ((x.sum(0) * torch.arange(28)).sum() / total).item()


def to_gray(img):
    gray = img.convert("L")
    return torch.frombuffer(bytearray(gray.tobytes()), dtype=torch.uint8).view(
        gray.height, gray.width).float() / 255


def test_a_dark_off_centre_photo_becomes_a_centred_white_on_black_digit():
    picture = digit_picture(8, size=(400, 300), centre=(290, 80), font_size=120)
    x = predict.preprocess(to_gray(picture))
    assert x.shape == (28, 28)
    assert x.max() == pytest.approx(1.0, abs=0.05) and x.min() == 0
    inked = (x > 0.1).nonzero()
    height = inked[:, 0].max() - inked[:, 0].min() + 1
    width = inked[:, 1].max() - inked[:, 1].min() + 1
    assert max(height, width) in (19, 20, 21)  # scaled to fit a 20x20 box
    assert torch.all(x[:2] == 0) and torch.all(x[-2:] == 0)  # black border, as in MNIST
    cy, cx = centre_of_mass(x)
    assert abs(cy - 14) <= 0.5 and abs(cx - 14) <= 0.5


def test_the_result_does_not_depend_on_polarity_or_position():
    dark_on_light = predict.preprocess(to_gray(digit_picture(4, centre=(100, 90))))
    light_on_dark = predict.preprocess(to_gray(digit_picture(4, ink=(250, 250, 250),
                                                             paper=(10, 10, 10))))
    assert (dark_on_light - light_on_dark).abs().mean() < 0.02


def test_an_mnist_style_image_passes_through_unchanged():
    once = predict.preprocess(to_gray(digit_picture(3)))
    assert torch.equal(predict.preprocess(once), once)
    ## but a small digit in the corner of a 28x28 black canvas is still scaled and centred
    corner = torch.zeros(28, 28)
    corner[1:11, 1:11] = F.interpolate(once[None, None], size=(10, 10), mode="area")[0, 0]
    fixed = predict.preprocess(corner)
    rows = (fixed > 0.3).any(dim=1).nonzero()[:, 0]
    assert 17 <= rows[-1] - rows[0] + 1 <= 21
    assert all(abs(c - 14) < 1 for c in centre_of_mass(fixed))


def test_transparency_and_exif_rotation_are_respected(tmp_path):
    reference = predict.preprocess(to_gray(digit_picture(2, paper=(255, 255, 255),
                                                         ink=(0, 0, 0))))
    ## black ink on a fully transparent (black underneath) background
    rgba = digit_picture(2, paper=(0, 0, 0), ink=(0, 0, 0)).convert("RGBA")
    alpha = digit_picture(2, paper=(0, 0, 0), ink=(255, 255, 255)).convert("L")
    rgba.putalpha(alpha)
    rgba.save(tmp_path / "transparent.png")
    ## a phone photo stored sideways, with EXIF orientation 6 ("rotate 90 degrees clockwise")
    exif = Image.Exif()
    exif[0x0112] = 6
    digit_picture(2, paper=(255, 255, 255), ink=(0, 0, 0)).rotate(90, expand=True).save(
        tmp_path / "sideways.png", exif=exif)
    for name in ("transparent.png", "sideways.png"):
        x = predict.preprocess(predict.load_gray(tmp_path / name))
        assert (x - reference).abs().mean() < 0.02, name


def test_predict_classifies_pictures_end_to_end(trained_checkpoint, tmp_path, capsys):
    paths = []
    for digit in range(10):
        paths.append(tmp_path / f"digit_{digit}.jpg")
        digit_picture(digit).save(paths[-1], quality=90)
    rc = predict.main(["--checkpoint", str(trained_checkpoint), "--top-k", "3",
                       "--save-input", str(tmp_path / "seen"), *map(str, paths)])
    assert rc == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 10
    assert all(line.startswith(f"{p}: ") and line.count("%") == 3 for line, p in zip(lines, paths))
    right = sum(line.split(": ")[1].startswith(f"{d} (") for d, line in enumerate(lines))
    assert right >= 8, lines
    seen = Image.open(tmp_path / "seen" / "digit_3.png")
    assert seen.size == (28, 28) and seen.mode == "L"


def test_json_output_has_path_prediction_and_ten_probabilities(trained_checkpoint, tmp_path,
                                                               capsys):
    digit_picture(1).save(tmp_path / "one.png")
    assert predict.main(["--checkpoint", str(trained_checkpoint), "--json",
                         str(tmp_path / "one.png")]) == 0
    [result] = json.loads(capsys.readouterr().out)
    assert set(result) == {"path", "prediction", "probabilities"}
    assert result["path"] == str(tmp_path / "one.png") and isinstance(result["prediction"], int)
    assert len(result["probabilities"]) == 10 and sum(result["probabilities"]) == pytest.approx(1)
    assert result["prediction"] == max(range(10), key=result["probabilities"].__getitem__)


def test_a_missing_checkpoint_says_how_to_train_one(tmp_path, capsys):
    digit_picture(1).save(tmp_path / "one.png")
    assert predict.main(["--checkpoint", str(tmp_path / "none.pt"), str(tmp_path / "one.png")]) == 1
    err = capsys.readouterr().err
    assert "does not exist" in err and "python mnist_train.py" in err


def test_bad_files_are_reported_and_the_good_ones_still_classified(trained_checkpoint, tmp_path,
                                                                    capsys):
    digit_picture(5).save(tmp_path / "good.png")
    (tmp_path / "notes.txt").write_text("not an image")
    rc = predict.main(["--checkpoint", str(trained_checkpoint), str(tmp_path / "missing.png"),
                       str(tmp_path / "notes.txt"), str(tmp_path / "good.png")])
    out, err = capsys.readouterr()
    assert rc == 1
    assert f"{tmp_path / 'missing.png'}: error: no such file" in err
    assert f"{tmp_path / 'notes.txt'}: error: is not an image" in err
    assert out.startswith(f"{tmp_path / 'good.png'}: ")


# reading every kind of picture ------------------------------------------------------------------
def reference_digit():
    return predict.preprocess(to_gray(digit_picture(2, paper=(255, 255, 255), ink=(0, 0, 0))))


def save_in_mode(tmp_path, mode):
    img = digit_picture(2, paper=(255, 255, 255), ink=(0, 0, 0))
    path = tmp_path / f"digit_{mode.replace(';', '_')}.{'jpg' if mode == 'CMYK' else 'png'}"
    if mode == "I;16":  # 16-bit grayscale: 0..65535
        gray = img.convert("L")
        img = Image.new("I;16", gray.size)
        img.frombytes(b"".join(int(v * 257).to_bytes(2, "little") for v in gray.tobytes()))
    elif mode == "LA":  # gray + alpha: ink opaque, paper transparent (and black underneath)
        alpha = img.convert("L").point(lambda v: 255 - v)
        img = Image.merge("LA", (Image.new("L", img.size, 0), alpha))
    else:
        img = img.convert(mode)
    img.save(path)
    return path


@pytest.mark.parametrize("mode", ["I;16", "P", "RGBA", "LA", "CMYK", "1"])
def test_unusual_image_modes_are_read_correctly(tmp_path, mode):
    x = predict.preprocess(predict.load_gray(save_in_mode(tmp_path, mode)))
    assert (x - reference_digit()).abs().mean() < 0.03, mode


def tiny_png_header(width, height):
    """A PNG that claims to be width x height: enough for Pillow to read its size."""
    import struct
    import zlib

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(
            ">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64))\
        + chunk(b"IEND", b"")


@pytest.mark.parametrize("make, message", [
    (lambda p: p.mkdir(), "is a directory"),
    (lambda p: p.write_bytes(b""), "is empty (0 bytes)"),
    (lambda p: p.write_text("just text"), "is not an image Pillow can read"),
    (lambda p: p.write_bytes(tiny_png_header(60_000, 60_000)), "refused: too many pixels"),
])
def test_each_kind_of_bad_file_gets_its_own_message(tmp_path, make, message):
    path = tmp_path / "bad.png"
    make(path)
    with pytest.raises(predict.ImageProblem, match=re.escape(message)):
        predict.load_gray(path)


def test_a_truncated_image_is_reported(tmp_path):
    digit_picture(3).save(tmp_path / "full.jpg", quality=95)
    data = (tmp_path / "full.jpg").read_bytes()
    (tmp_path / "cut.jpg").write_bytes(data[: len(data) // 2])
    with pytest.raises(predict.ImageProblem, match="truncated or damaged"):
        predict.load_gray(tmp_path / "cut.jpg")


def test_a_blank_picture_gets_a_warning(trained_checkpoint, tmp_path, capsys):
    Image.new("RGB", (200, 200), (240, 240, 235)).save(tmp_path / "blank.png")
    assert predict.main(["--checkpoint", str(trained_checkpoint), str(tmp_path / "blank.png")]) == 0
    assert "warning: no digit found" in capsys.readouterr().err


# robustness to real pictures --------------------------------------------------------------------
def plain():
    return predict.preprocess(to_gray(digit_picture(5)))


def close_to_plain(picture, tolerance=0.06):
    x = predict.preprocess(to_gray(picture))
    return (x - plain()).abs().mean().item() < tolerance, (x - plain()).abs().mean().item()


def test_grid_and_ruled_lines_are_removed():
    for step, grid in ((14, True), (18, False)):
        picture = digit_picture(5)
        pixels = picture.load()
        for y in range(picture.height):
            for x in range(picture.width):
                if y % step == 3 or (grid and x % step == 3):
                    pixels[x, y] = (90, 110, 150)  # dark, blue-grey printed lines
        ok, diff = close_to_plain(picture)
        assert ok, (step, grid, diff)


def test_uneven_light_and_coloured_paper_are_evened_out():
    from PIL import ImageChops

    picture = digit_picture(5, paper=(250, 235, 120))  # yellow paper
    light = Image.linear_gradient("L").rotate(60).resize(picture.size)  # dark corner to bright
    light = light.point(lambda v: 110 + v * 145 // 255).convert("RGB")
    ok, diff = close_to_plain(ImageChops.multiply(picture, light))
    assert ok, diff


def test_specks_and_a_page_edge_are_ignored():
    picture = digit_picture(5, size=(400, 300), centre=(200, 150))
    pixels = picture.load()
    for x, y in ((20, 30), (370, 40), (60, 260), (330, 270)):  # dust and dots
        for dx in range(3):
            for dy in range(3):
                pixels[x + dx, y + dy] = (20, 20, 20)
    for y in range(300):  # the dark table beyond the paper's left edge
        for x in range(12):
            pixels[x, y] = (60, 50, 40)
    ok, diff = close_to_plain(picture)
    assert ok, diff


@pytest.mark.parametrize("pen", [1, 3, 40])  # a 1-px mouse line, a pen, a fat marker
def test_strokes_of_any_width_get_mnist_width(pen):
    from PIL import ImageDraw

    picture = Image.new("RGB", (400, 400), "white")
    ImageDraw.Draw(picture).line([(110, 70), (290, 70), (170, 330)], fill="black", width=pen)
    x = predict.preprocess(to_gray(picture))
    width = predict.stroke_width(F.interpolate(x[None, None], scale_factor=4, mode="bilinear")
                                 [0, 0] > 0.5) / 4
    assert 1.8 < width < 3.2, width  # MNIST's strokes: about 2.4 px


def test_tight_crops_and_big_margins_give_the_same_digit():
    tight = digit_picture(5).crop((95, 40, 205, 180))
    margin = digit_picture(5, size=(1200, 900), centre=(800, 300), font_size=150)
    for picture in (tight, margin):
        ok, diff = close_to_plain(picture, tolerance=0.08)
        assert ok, diff


def test_an_mnist_image_stays_as_it_is(tiny_mnist):
    import common

    images, _ = common.load_mnist(tiny_mnist, train=False)
    passed_through = 0
    for image in images[:20]:
        x = image.float() / 255
        once = predict.preprocess(x)
        if predict.already_mnist(x):  # 28x28, white on black, ~20 px tall, centred
            assert torch.equal(once, x)
            passed_through += 1
        assert torch.equal(predict.preprocess(once), once)  # the output is MNIST-like itself
    assert 0 < passed_through < 20  # the font digits come in MNIST's size and smaller
