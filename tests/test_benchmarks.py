"""benchmarks/real_pictures.py: a folder of pictures named by their digit, as a user makes one;
and bench_pipeline.py's --chunk mode."""

import sys
from pathlib import Path

import pytest
import torch
from helpers import digit_picture
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import real_pictures  # noqa: E402


def score(monkeypatch, *argv):
    monkeypatch.setattr(sys, "argv", ["real_pictures.py", *argv])
    real_pictures.main()


def test_a_folder_with_broken_files_is_scored_and_its_misses_drawn(trained_checkpoint, tmp_path,
                                                                   monkeypatch, capsys):
    folder = tmp_path / "mine"
    folder.mkdir()
    for digit in (3, 5, 7):
        digit_picture(digit).save(folder / f"{digit}_1.png")
    (folder / "7_empty.png").write_bytes(b"")  # unreadable: a miss, drawn as a gray square
    (folder / "2_text.jpg").write_text("not a picture")
    digit_picture(4).save(folder / "4_x1\u00b2.png")  # "²" is a digit to \d, not to int()
    (folder / "notes.txt").write_text("left out: not a picture's extension")
    sheet = tmp_path / "misses.png"
    score(monkeypatch, "--images", str(folder), "--checkpoint", str(trained_checkpoint),
          "--misses", str(sheet), "--errors")
    out = capsys.readouterr().out
    assert out.startswith(f"6 pictures in {folder}/")
    assert "| model | all | \n" in out  # no SOURCES.md: no columns per kind
    assert "7_empty.png: unreadable: is empty (0 bytes)" in out
    assert "2_text.jpg: unreadable: is not an image" in out
    assert "7_empty.png (other) is 7, read as -1" in out  # an unreadable picture is a miss
    assert f"wrote {sheet}: " in out
    with Image.open(sheet) as img:  # 6 columns of tiles 236 px wide: every miss was drawn
        assert img.width == 6 * 236 + 4


def test_misreadings_are_counted_by_pair_the_most_frequent_first(trained_checkpoint, tmp_path,
                                                                  monkeypatch, capsys):
    ## Pictures named for another digit are misread on purpose: two 3s named 8, a 5 named 6.
    for digit, name in ((3, "8_1"), (3, "8_2"), (5, "6_1"), (7, "7_1")):
        digit_picture(digit).save(tmp_path / f"{name}.png")
    (tmp_path / "2_empty.png").write_bytes(b"")  # unreadable: read as -1
    score(monkeypatch, "--images", str(tmp_path), "--checkpoint", str(trained_checkpoint),
          "--misses", "")
    out = capsys.readouterr().out
    table = out[out.index("misreadings, the most frequent first"):].splitlines()
    assert table[3] == "| mnist_mlp | 8 -> 3: 2, 2 -> -1: 1, 6 -> 5: 1 |"
    folder = tmp_path / "right"
    folder.mkdir()
    digit_picture(7).save(folder / "7_1.png")
    score(monkeypatch, "--images", str(folder), "--checkpoint", str(trained_checkpoint),
          "--misses", "")
    assert "| mnist_mlp | none |\n" in capsys.readouterr().out


@pytest.mark.parametrize("given, message", [
    ("missing", "--images {}: not a folder"),
    ("3_1.png", "--images {}: not a folder"),
    ("empty", "error: no pictures named <digit>_... ("),
])
def test_a_wrong_folder_is_one_line_not_a_traceback(tmp_path, monkeypatch, given, message):
    digit_picture(3).save(tmp_path / "3_1.png")
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit) as exit_:
        score(monkeypatch, "--images", str(tmp_path / given), "--speed-only")
    assert message.format(tmp_path / given) in str(exit_.value.code)


def test_a_missing_checkpoint_is_one_line_not_a_traceback(tmp_path, monkeypatch):
    digit_picture(3).save(tmp_path / "3_1.png")
    with pytest.raises(SystemExit) as exit_:
        score(monkeypatch, "--images", str(tmp_path), "--checkpoint", str(tmp_path / "no.pt"))
    assert str(exit_.value.code).startswith(f"error: checkpoint {tmp_path / 'no.pt'} does not "
                                            "exist.")


SOURCES = """| file | label | kind | repo |
|---|---|---|---|
| 3_1.png | 3 | drawing | someone/digits |
| 5_1.png | 5 | photo | someone/digits |
| 7_1.png | 7 | drawing | another/one |
"""

## Another version of the clean-up, as --compare-with loads it: this one, except that it
## cannot read the 7.
WORSE_ON_SEVENS = """
from plumbing import digit_cleanup
from plumbing.digit_cleanup import ImageProblem, preprocess

def load_gray(path):
    if path.name.startswith("7"):
        raise ImageProblem("not read by this version")
    return digit_cleanup.load_gray(path)
"""


def test_compare_with_scores_one_checkpoint_with_both_versions_source_by_source(
        trained_checkpoint, tmp_path, monkeypatch, capsys):
    folder = tmp_path / "mine"
    folder.mkdir()
    for digit in (3, 5, 7):
        digit_picture(digit).save(folder / f"{digit}_1.png")
    (folder / "SOURCES.md").write_text(SOURCES)
    other = tmp_path / "old_cleanup.py"
    other.write_text(WORSE_ON_SEVENS)
    score(monkeypatch, "--images", str(folder), "--checkpoint", str(trained_checkpoint),
          "--compare-with", str(other), "--misses", "")
    out = capsys.readouterr().out
    assert "| mnist_mlp | 100.0% (3/3) | 2/2 | 1/1 |\n" in out
    assert f"| mnist_mlp with {other} | 66.7% (2/3) | 1/2 | 1/1 |\n" in out
    assert "7_1.png with " in out and "unreadable: not read by this version" in out
    per_source = out[out.index(f"mnist_mlp against mnist_mlp with {other}"):].splitlines()
    assert per_source[3:8] == ["| another/one | 1 | 1 | 0 | +1 |",
                               "| someone/digits | 2 | 2 | 2 | +0 |",
                               "sources: 1 won, 0 lost, 1 even",
                               "pictures that flipped: 1 won, 0 lost",
                               "  won  7_1.png (drawing, another/one): 7 read as 7 here, -1 there"]


def test_speed_only_times_another_version_in_the_same_rounds(tmp_path, monkeypatch, capsys):
    from plumbing import digit_cleanup

    for digit in (3, 5):
        digit_picture(digit).save(tmp_path / f"{digit}_1.png")
    ## itself, as "another"
    other = Path(__file__).resolve().parent.parent / "plumbing" / "digit_cleanup.py"
    score(monkeypatch, "--images", str(tmp_path), "--speed-only", "--rounds", "2",
          "--compare-with", str(other))
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines[::3]] == ["round 1", "round 2"]
    assert lines[1].startswith(f"  {other}: reading and clean-up per picture: median ")
    assert "x as fast at the median, " in lines[2] and lines[2].endswith("x at the slowest")
    ## this version's module is put back
    assert sys.modules["plumbing.digit_cleanup"] is digit_cleanup
    with pytest.raises(SystemExit) as exit_:
        score(monkeypatch, "--images", str(tmp_path), "--speed-only", "--compare-with",
              str(tmp_path / "nope.py"))
    assert str(exit_.value.code) == f"error: --compare-with {tmp_path / 'nope.py'}: no such file"


def test_bench_pipeline_chunk_alternates_rounds_of_steps_after_an_epoch_of_warm_up(
        tiny_mnist, monkeypatch, capsys):
    """--chunk: (b), (c) and (d) in turns of K steps; the first epoch's turns are not compared."""
    import bench_pipeline

    monkeypatch.setattr(sys, "argv", ["bench_pipeline.py", "--data-dir", str(tiny_mnist),
                                      "--chunk", "5", "--epochs", "2"])
    try:
        bench_pipeline.main()
    finally:
        torch.set_flush_denormal(False)  # main() sets it for the whole process
    ## 800 images in batches of 64: 13 steps an epoch, 26 in two; turns of 5 steps start at
    ## steps 0, 5, 10, 15 and 20; the first 3 of them (15 steps: an epoch's worth) warm up.
    summary, ratios = capsys.readouterr().out.splitlines()[-2:]
    assert summary.startswith("mlp on cpu, 2 rounds of 5 steps (batch 64) after 3 of warm-up")
    assert ratios.startswith("(b)/(c) = ") and "(d)/(c) = " in ratios
    for argv in (["--chunk", "5", "--end-to-end"], ["--chunk", "13"],
                 ["--chunk", "12", "--epochs", "2"]):
        monkeypatch.setattr(sys, "argv", ["bench_pipeline.py", "--data-dir", str(tiny_mnist),
                                          *argv])
        with pytest.raises(SystemExit) as exit_:
            bench_pipeline.main()
        ## Refused: not with --end-to-end; 13 x 64 is over 800 images; turns of 12 steps leave
        ## none to compare after the warm-up (26 steps: 2 turns, both warm-up).
        assert exit_.value.code
