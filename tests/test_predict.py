"""predict.py: the command line, on pictures and checkpoints."""

import json
import sys
from pathlib import Path

import pytest
import torch
from helpers import digit_picture, posix_only
from PIL import Image

import predict
from plumbing import digit_cleanup, files


def results(out, checkpoint):
    """The result lines of predict.py's output, after its first line, which names the model."""
    first, *rest = out.splitlines()
    assert first.startswith(f"{checkpoint}: mlp 784-128-64-10, epoch "), first
    return rest


def test_predict_classifies_pictures_end_to_end(trained_checkpoint, tmp_path, capsys):
    paths = []
    for digit in range(10):
        paths.append(tmp_path / f"digit_{digit}.jpg")
        digit_picture(digit).save(paths[-1], quality=90)
    rc = predict.main(["--checkpoint", str(trained_checkpoint), "--top-k", "3",
                       "--save-input", str(tmp_path / "seen"), *map(str, paths)])
    assert rc == 0
    lines = results(capsys.readouterr().out, trained_checkpoint)
    assert len(lines) == 10
    assert all(line.startswith(f"{p}: ") and line.count("%") == 3 for line, p in zip(lines, paths))
    right = sum(line.split(": ")[1].startswith(f"{d} (") for d, line in enumerate(lines))
    assert right >= 8, lines
    seen = Image.open(tmp_path / "seen" / "digit_3.png")
    assert seen.size == (28, 28) and seen.mode == "L"


def test_a_checkpoint_of_an_earlier_version_with_its_training_state_inside_still_classifies(
        trained_checkpoint, tmp_path, capsys):
    ## Until this version, the file predict.py loads also held the state for --resume.
    import common

    checkpoint = files.read_checkpoint(trained_checkpoint)
    weights = checkpoint["state_dict"]
    optimizer = torch.optim.Adam(common.build_model("mlp").parameters()).state_dict()
    checkpoint["training"] = {"epoch": 25, "history": [[25, 0.1, 0.2, 0.9, 0.5, 1]],
                              "settings": ["--lr", "0.002"], "rng": torch.get_rng_state(),
                              "model": weights, "optimizer": optimizer}
    torch.save(checkpoint, tmp_path / "old.pt")
    digit_picture(3).save(tmp_path / "three.png")
    old, three = tmp_path / "old.pt", tmp_path / "three.png"
    assert predict.main(["--checkpoint", str(old), str(three)]) == 0
    assert capsys.readouterr().out.splitlines()[1].startswith(f"{three}: ")


def test_json_output_has_path_prediction_and_ten_probabilities(trained_checkpoint, tmp_path,
                                                               capsys):
    digit_picture(1).save(tmp_path / "one.png")
    assert predict.main(["--checkpoint", str(trained_checkpoint), "--json",
                         str(tmp_path / "one.png")]) == 0
    [result] = json.loads(capsys.readouterr().out)
    assert set(result) == {"path", "prediction", "class", "probabilities", "warning",
                           "checkpoint", "model"}
    assert result["checkpoint"] == str(trained_checkpoint) and result["model"] == "mlp"
    assert result["class"] == str(result["prediction"])
    assert result["warning"] is None
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
    assert results(out, trained_checkpoint)[0].startswith(f"{tmp_path / 'good.png'}: ")


def test_json_lists_a_bad_file_with_its_error_in_its_place(trained_checkpoint, tmp_path,
                                                            capsys):
    digit_picture(5).save(tmp_path / "good.png")
    (tmp_path / "notes.png").write_text("not an image")
    paths = [str(tmp_path / "notes.png"), str(tmp_path / "good.png")]
    assert predict.main(["--checkpoint", str(trained_checkpoint), "--json", *paths]) == 1
    bad, good = json.loads(capsys.readouterr().out)
    assert bad == {"path": paths[0], "error": "is not an image Pillow can read (PNG, JPEG, BMP, "
                                              "GIF, TIFF, WebP...)"}
    assert good["path"] == paths[1] and "error" not in good and good["warning"] is None


def test_a_blank_picture_gets_a_warning(trained_checkpoint, tmp_path, capsys):
    Image.new("RGB", (200, 200), (240, 240, 235)).save(tmp_path / "blank.png")
    assert predict.main(["--checkpoint", str(trained_checkpoint), str(tmp_path / "blank.png")]) == 0
    assert "warning: no digit found" in capsys.readouterr().err


# pictures with no digit -------------------------------------------------------------------------
def one_dot(size, value=1.0, background=0.0):
    x = torch.full(size, background)
    x[size[0] // 3, size[1] // 2] = value
    return x


def test_a_no_digit_picture_is_marked_in_json(trained_checkpoint, tmp_path, capsys):
    Image.fromarray((one_dot((28, 28)) * 255).byte().numpy()).save(tmp_path / "dot.png")
    digit_picture(3).save(tmp_path / "three.png")
    assert predict.main(["--checkpoint", str(trained_checkpoint), "--json",
                         str(tmp_path / "dot.png"), str(tmp_path / "three.png")]) == 0
    out, err = capsys.readouterr()
    dot, three = json.loads(out)
    assert dot["warning"].startswith("no digit found: the ink is a speck")
    assert three["warning"] is None
    assert f"{tmp_path / 'dot.png'}: warning: no digit found" in err


# no picture stops the others ----------------------------------------------------------------
def test_a_1x1_picture_is_refused_and_the_pictures_around_it_are_classified(
        trained_checkpoint, tmp_path, capsys):
    digit_picture(2).save(tmp_path / "a.png")
    Image.new("RGB", (1, 1), "white").save(tmp_path / "b.png")
    digit_picture(7).save(tmp_path / "c.png")
    paths = [str(tmp_path / name) for name in ("a.png", "b.png", "c.png")]
    assert predict.main(["--checkpoint", str(trained_checkpoint), *paths]) == 1
    out, err = capsys.readouterr()
    assert [line.split(": ")[0] for line in results(out, trained_checkpoint)] == [paths[0],
                                                                                  paths[2]]
    assert err == f"{paths[1]}: error: is only 1 x 1 pixels: too small to hold a digit\n"


def test_an_unexpected_error_on_one_picture_is_one_line_and_the_rest_go_on(
        trained_checkpoint, tmp_path, capsys, monkeypatch):
    real = digit_cleanup.preprocess

    def broken_on_b(gray):
        if gray.shape == (220, 301):  # only the picture "b" has this size
            raise RuntimeError("kthvalue(): selected number k out of range")
        return real(gray)

    monkeypatch.setattr(digit_cleanup, "preprocess", broken_on_b)
    digit_picture(2).save(tmp_path / "a.png")
    digit_picture(5, size=(301, 220)).save(tmp_path / "b.png")
    digit_picture(7).save(tmp_path / "c.png")
    paths = [str(tmp_path / name) for name in ("a.png", "b.png", "c.png")]
    assert predict.main(["--checkpoint", str(trained_checkpoint), *paths]) == 1
    out, err = capsys.readouterr()
    assert [line.split(": ")[0] for line in results(out, trained_checkpoint)] == [paths[0],
                                                                                  paths[2]]
    assert err == (f"{paths[1]}: error: unexpected RuntimeError: kthvalue(): selected number k "
                   "out of range. This is a bug, not a fault of the input: please report it "
                   "with the input (--debug shows the traceback).\n")
    assert predict.main(["--checkpoint", str(trained_checkpoint), "--debug", paths[1]]) == 1
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):") and "broken_on_b" in err


def test_a_bad_save_input_folder_is_refused_before_any_picture(trained_checkpoint, tmp_path,
                                                                capsys):
    (tmp_path / "file").write_text("x")
    digit_picture(2).save(tmp_path / "a.png")
    with pytest.raises(SystemExit) as exit_:
        predict.main(["--checkpoint", str(trained_checkpoint), "--save-input",
                      str(tmp_path / "file"), str(tmp_path / "a.png")])
    assert exit_.value.code == 2
    out, err = capsys.readouterr()
    assert f"--save-input {tmp_path / 'file'}: {tmp_path / 'file'} exists and is not a folder" \
        in err and out == ""


@pytest.mark.parametrize("flag, value, allowed", [("--top-k", "11", "1 to 10"),
                                                   ("--top-k", "0", "1 to 10"),
                                                   ("--port", "65536", "0 to 65535"),
                                                   ("--port", "-1", "0 to 65535")])
def test_numbers_out_of_range_are_usage_errors(flag, value, allowed, capsys):
    with pytest.raises(SystemExit) as exit_:
        predict.main([flag, value, "a.png"])
    assert exit_.value.code == 2
    assert f"{flag}: expected a whole number from {allowed}, got '{value}'" in \
        capsys.readouterr().err


@pytest.mark.parametrize("typed", ["--top", "--topk"])
def test_a_shortened_or_mistyped_flag_is_refused_with_the_one_meant(typed, capsys):
    ## argparse would otherwise take --top for --top-k without a word.
    with pytest.raises(SystemExit) as exit_:
        predict.main([typed, "3", "a.png"])
    assert exit_.value.code == 2
    assert f"unrecognized arguments: {typed} (did you mean --top-k?)" in capsys.readouterr().err


# choosing the model, and messages that say what to do -----------------------------------------
def test_model_cnn_picks_the_cnns_default_checkpoint_or_says_how_to_train_it(
        trained_checkpoint, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    digit_picture(2).save(tmp_path / "two.png")
    assert predict.main(["--model", "cnn", "two.png"]) == 1
    err = capsys.readouterr().err
    assert err == (f"error: checkpoint {tmp_path / 'checkpoints' / 'mnist_cnn.pt'} does not "
                   "exist. Train one first: python mnist_train.py --model cnn\n")
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "mnist_cnn.pt").write_bytes(trained_checkpoint.read_bytes())
    assert predict.main(["--model", "cnn", "two.png"]) == 0  # the file there is what answers
    assert capsys.readouterr().out.startswith(f"{Path('checkpoints') / 'mnist_cnn.pt'}: mlp")
    with pytest.raises(SystemExit):
        predict.main(["--model", "cnn", "--checkpoint", "x.pt", "two.png"])
    assert "argument --checkpoint: not allowed with argument --model" in capsys.readouterr().err


def test_a_checkpoint_among_the_pictures_gets_did_you_mean(trained_checkpoint, tmp_path,
                                                           capsys):
    digit_picture(6).save(tmp_path / "six.png")
    assert predict.main(["--checkpoint", str(trained_checkpoint), str(trained_checkpoint),
                         str(tmp_path / "six.png")]) == 1
    out, err = capsys.readouterr()
    assert err == (f"{trained_checkpoint}: error: is a checkpoint, not a picture: did you mean "
                   f"--checkpoint {trained_checkpoint}?\n")
    assert results(out, trained_checkpoint)[0].startswith(f"{tmp_path / 'six.png'}: ")


@pytest.mark.parametrize("name, message", [
    ("digit.png", "is not a checkpoint saved by this repo."),
    ("cut.pt", "is cut short or damaged (BadZipFile): use a good copy, or train again."),
])
def test_a_bad_checkpoint_is_one_whole_sentence_that_never_suggests_weights_only_false(
        trained_checkpoint, tmp_path, capsys, name, message):
    bad = tmp_path / name
    if name == "digit.png":
        digit_picture(1).save(bad)
    else:
        bad.write_bytes(trained_checkpoint.read_bytes()[:3000])
    digit_picture(1).save(tmp_path / "one.png")
    assert predict.main(["--checkpoint", str(bad), str(tmp_path / "one.png")]) == 1
    err = capsys.readouterr().err
    assert err == f"error: {bad} {message}\n"
    assert "weights_only" not in err and ".." not in err


def test_save_input_gives_two_pictures_with_one_name_two_files(trained_checkpoint, tmp_path):
    (tmp_path / "marker").mkdir()
    (tmp_path / "mouse").mkdir()
    digit_picture(3).save(tmp_path / "marker" / "d3A.jpg")
    digit_picture(8).save(tmp_path / "mouse" / "d3a.png")  # one name where case is ignored
    assert predict.main(["--checkpoint", str(trained_checkpoint), "--save-input",
                         str(tmp_path / "seen"), str(tmp_path / "marker" / "d3A.jpg"),
                         str(tmp_path / "mouse" / "d3a.png")]) == 0
    assert sorted(p.name for p in (tmp_path / "seen").iterdir()) == ["d3A.png", "d3a-2.png"]
    assert (tmp_path / "seen" / "d3A.png").read_bytes() != (
        tmp_path / "seen" / "d3a-2.png").read_bytes()


def test_an_input_that_cannot_be_saved_is_an_error_for_that_picture_only(trained_checkpoint,
                                                                          tmp_path, capsys):
    digit_picture(3).save(tmp_path / "three.png")
    digit_picture(7).save(tmp_path / "seven.png")
    (tmp_path / "seen" / "three.png").mkdir(parents=True)  # in the way of three's input
    assert predict.main(["--checkpoint", str(trained_checkpoint), "--json", "--save-input",
                         str(tmp_path / "seen"), str(tmp_path / "three.png"),
                         str(tmp_path / "seven.png")]) == 1
    three, seven = json.loads(capsys.readouterr().out)
    ## Classified all the same: the error has a key of its own, "error" meaning no result.
    assert three["save_input_error"].startswith("--save-input could not save what the model "
                                                f"saw: {tmp_path / 'seen' / 'three.png'} is not a "
                                                "regular file")
    assert three["prediction"] is not None and "error" not in three
    assert "save_input_error" not in seven
    assert (tmp_path / "seen" / "seven.png").is_file()


def test_a_pattern_no_shell_expanded_is_expanded_here(trained_checkpoint, tmp_path, capsys):
    ## Windows' cmd and PowerShell pass photos/*.jpg to Python as it is.
    for digit in (1, 7):
        digit_picture(digit).save(tmp_path / f"d{digit}.jpg")
    assert predict.main(["--checkpoint", str(trained_checkpoint),
                         str(tmp_path / "*.jpg")]) == 0
    lines = results(capsys.readouterr().out, trained_checkpoint)
    assert [line.split(": ")[0] for line in lines] == [str(tmp_path / "d1.jpg"),
                                                       str(tmp_path / "d7.jpg")]
    assert predict.main(["--checkpoint", str(trained_checkpoint), str(tmp_path / "*.gif")]) == 1
    assert f"{tmp_path / '*.gif'}: error: no such file" in capsys.readouterr().err


def test_a_batch_into_one_cp1252_file_keeps_its_order_and_every_name(trained_checkpoint,
                                                                       tmp_path):
    ## `python predict.py *.png > log.txt 2>&1` as on Windows, whose redirected output is in the
    ## console's code page (cp1252): a name it cannot show must not stop the batch, and an
    ## error (stderr, unbuffered) must not land above the answers printed (buffered) before it.
    import os
    import subprocess

    names = ["数字.png", "b.png", "c.png"]
    digit_picture(3).save(tmp_path / names[0])
    (tmp_path / "b.png").write_text("not a picture")
    digit_picture(5).save(tmp_path / "c.png")
    with open(tmp_path / "log.txt", "wb") as log:
        subprocess.run([sys.executable, "predict.py", "--checkpoint", str(trained_checkpoint),
                        *(str(tmp_path / n) for n in names)],
                       cwd=Path(predict.__file__).parent, stdout=log, stderr=subprocess.STDOUT,
                       env={**{k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"},
                            "PYTHONIOENCODING": "cp1252"})
    lines = (tmp_path / "log.txt").read_bytes().decode("cp1252").splitlines()
    assert [line.split(": ")[0] for line in lines[1:]] == [
        str(tmp_path / n) for n in ("\\u6570\\u5b57.png", "b.png", "c.png")]
    assert ": error: " in lines[2] and ": error: " not in lines[1] + lines[3]


@pytest.mark.skipif(sys.platform == "win32", reason="Windows allows no control characters "
                    "in file names")
def test_a_name_with_a_newline_or_an_escape_code_prints_as_one_line_of_escapes(
        trained_checkpoint, tmp_path, capsys):
    ## A name could otherwise print as two lines, one looking like another picture's answer,
    ## or send the terminal an escape code.
    name = "seven\n3.png: 3 (99.0%)\x1b[2J.png"
    digit_picture(7).save(tmp_path / name)
    assert predict.main(["--checkpoint", str(trained_checkpoint), str(tmp_path / name)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and out[1].startswith(
        f"{tmp_path}/seven\\n3.png: 3 (99.0%)\\x1b[2J.png: ")


def test_a_cnn_is_described_by_name_and_a_missing_given_checkpoint_says_how_to_make_it(
        tmp_path, capsys):
    assert files.describe({"model_name": "cnn", "epoch": 4, "val_accuracy": 0.99}) == \
        "cnn, epoch 4, val acc 0.9900"
    ## A checkpoint made by hand may give no number: the line says "?" instead of failing.
    assert files.describe({"model_name": "cnn", "val_accuracy": "high"}) == \
        "cnn, epoch ?, val acc ?"
    digit_picture(1).save(tmp_path / "one.png")
    assert predict.main(["--checkpoint", str(tmp_path / "mine.pt"), str(tmp_path / "one.png"),
                         "--save-input", str(tmp_path / "seen")]) == 1
    assert not (tmp_path / "seen").exists()  # nothing classified: no folder made for it
    assert capsys.readouterr().err.endswith(
        "Train one first (for a CNN, add --model cnn): python mnist_train.py --save-path "
        f"{tmp_path / 'mine.pt'}\n")


def test_save_input_into_the_pictures_own_folder_never_replaces_them(trained_checkpoint,
                                                                     tmp_path):
    digit_picture(3).save(tmp_path / "three.png")
    digit_picture(7).save(tmp_path / "Seven.jpg")
    digit_picture(8).save(tmp_path / "seven.png")  # Seven.jpg's input would be seven.png
    before = {name: (tmp_path / name).read_bytes() for name in ("three.png", "Seven.jpg",
                                                                "seven.png")}
    assert predict.main(["--checkpoint", str(trained_checkpoint), "--save-input", str(tmp_path),
                         *(str(tmp_path / name) for name in before)]) == 0
    assert all((tmp_path / name).read_bytes() == data for name, data in before.items())
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "Seven-2.png", "Seven.jpg", "seven-3.png", "seven.png", "three-2.png", "three.png"]


@pytest.mark.parametrize("checkpoint, message", [
    ("/dev/null", "checkpoint /dev/null is a folder, a device or a pipe, not a .pt file."),
    ("x" * 300 + ".pt", "does not exist. Train one first (for a CNN, add --model cnn): python "
                        "mnist_train.py --save-path " + "x" * 300 + ".pt"),  # over 255 characters
])
def test_a_checkpoint_path_that_is_no_file_says_what_it_is(tmp_path, capsys, checkpoint, message):
    if sys.platform == "win32":
        pytest.skip("POSIX paths")
    digit_picture(1).save(tmp_path / "one.png")
    assert predict.main(["--checkpoint", checkpoint, str(tmp_path / "one.png")]) == 1
    assert capsys.readouterr().err.strip().endswith(message)


@posix_only
def test_a_fifo_a_socket_or_a_device_is_one_line_and_the_batch_goes_on(trained_checkpoint,
                                                                        tmp_path, monkeypatch):
    ## A named pipe that nothing writes to would make open() wait for ever: the batch must go
    ## on to the next picture. A pipe the process was given is still read: standard input, and
    ## /dev/fd/N (bash's `<(...)`).
    import os
    import socket
    import subprocess

    monkeypatch.chdir(tmp_path)  # a short name for the socket: 104 characters at most
    os.mkfifo("pipe.png")
    digit_picture(3).save("good.png")
    given, writer = os.pipe()
    with os.fdopen(writer, "wb") as pipe:  # a picture of a few KB fits in a pipe's buffer
        pipe.write(Path("good.png").read_bytes())
    with socket.socket(socket.AF_UNIX) as server:
        server.bind("socket.png")
        proc = subprocess.run([sys.executable, str(Path(predict.__file__)), "--checkpoint",
                               str(trained_checkpoint), "pipe.png", "socket.png", "/dev/zero",
                               "/dev/stdin", f"/dev/fd/{given}", "good.png"], pass_fds=[given],
                              input=Path("good.png").read_bytes(), capture_output=True,
                              timeout=60)  # what fails, if it waits
    os.close(given)
    assert proc.returncode == 1
    assert proc.stderr.decode().splitlines() == [
        f"{name}: error: is not a regular file (a named pipe, a device or a socket): give a "
        "picture file, or pipe one in as /dev/stdin" for name in ("pipe.png", "socket.png",
                                                                  "/dev/zero")]
    assert [line.split(": ")[0] for line in results(proc.stdout.decode(), trained_checkpoint)
            ] == ["/dev/stdin", f"/dev/fd/{given}", "good.png"]


def test_rung_1s_state_dict_classifies_and_another_models_is_one_line(trained_checkpoint,
                                                                      tmp_path, capsys):
    ## mnist_minimal.py saves torch.save(model.state_dict(), "mnist_minimal.pt"): its MLP's
    ## names and shapes are those of common.MLP, and it was trained with MNIST's mean and std.
    import mnist_minimal

    trained = torch.load(trained_checkpoint, weights_only=True)["state_dict"]
    rung_1 = mnist_minimal.MLP()
    rung_1.load_state_dict(trained)  # the same names and shapes
    torch.save(rung_1.state_dict(), tmp_path / "mnist_minimal.pt")
    digit_picture(3).save(tmp_path / "three.png")
    assert predict.main(["--checkpoint", str(tmp_path / "mnist_minimal.pt"),
                         str(tmp_path / "three.png")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == (f"{tmp_path / 'mnist_minimal.pt'}: mlp 784-128-64-10, a state_dict "
                        "alone: read with MNIST's mean and std")
    assert lines[1].startswith(f"{tmp_path / 'three.png'}: 3 (")
    ## pytorch/examples' CNN: the names of this repo's CNN, other shapes
    torch.save({"conv1.weight": torch.zeros(32, 1, 3, 3), "conv2.weight": torch.zeros(64, 32, 3, 3),
                "fc1.weight": torch.zeros(128, 9216), "fc2.weight": torch.zeros(10, 128)},
               tmp_path / "examples.pt")
    assert predict.main(["--checkpoint", str(tmp_path / "examples.pt"),
                         str(tmp_path / "three.png")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1
    assert "it rebuilds common.py's MLP (fc1, fc2, ... from 28 x 28 = 784 inputs) and CNN" in err

