import json

import pytest
import torch
from conftest import digit_picture
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
    twice = predict.preprocess(once)
    assert (twice - once).abs().mean() < 0.01 and (twice - once).abs().max() < 0.15


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
