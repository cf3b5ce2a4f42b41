"""mnist_minimal.py, the first rung: the classic script, run as a reader runs it."""

import ast
import os
import sys
from pathlib import Path

import pytest
import torch

import mnist_minimal

REPO = Path(__file__).resolve().parent.parent


def run(monkeypatch, capsys, *argv) -> list[str]:
    monkeypatch.setattr(sys, "argv", ["mnist_minimal.py", *argv])
    mnist_minimal.main()
    return capsys.readouterr().out.splitlines()


def test_the_classic_script_trains_tests_and_keeps_the_best_epoch(tiny_mnist, tmp_path,
                                                                  monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda **_: None)  # the CPU
    real_test, weights = mnist_minimal.test, []

    def test_and_dip(model, loader, device):  # each epoch's weights; the last epoch scores 0
        correct, total = real_test(model, loader, device)
        weights.append({k: v.clone() for k, v in model.state_dict().items()})
        return (correct if len(weights) < 3 else 0), total

    monkeypatch.setattr(mnist_minimal, "test", test_and_dip)
    lines = run(monkeypatch, capsys, "--data-dir", str(tiny_mnist), "--epochs", "3")
    scores = [line for line in lines if line.startswith("Test Accuracy: ")]
    assert len(scores) == 3 and lines[-1] == scores[-1]  # it ends with a Test Accuracy line
    accuracies = [float(line.split()[2]) for line in scores]
    assert accuracies[2] == 0 and max(accuracies) > 0.3  # chance is 0.1: it learned
    ## The weights saved are those of the best epoch, not the last one.
    best = accuracies.index(max(accuracies))
    saved = torch.load(tmp_path / "mnist_minimal.pt", weights_only=True)
    assert all(torch.equal(saved[k], weights[best][k]) for k in saved)
    assert not all(torch.equal(saved[k], weights[2][k]) for k in saved)


def test_it_imports_nothing_of_this_repository():
    ## The reader's first script stands alone: copy it anywhere, and it runs.
    ours = {path.stem for path in REPO.glob("*.py")}
    tree = ast.parse((REPO / "mnist_minimal.py").read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree)
                if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom)}
    assert imported and not imported & ours, imported & ours


@pytest.mark.skipif(not (os.environ.get("MNIST_DATA_DIR") and os.environ.get("MNIST_FULL_CHECKS")
                         == "1"), reason="5 epochs of the classic pipeline on real MNIST take "
                    "tens of seconds: set MNIST_DATA_DIR and MNIST_FULL_CHECKS=1 to run it")
def test_real_mnist_reaches_the_seed_s_97_percent_in_5_epochs(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    lines = run(monkeypatch, capsys, "--data-dir", os.environ["MNIST_DATA_DIR"])
    assert float(lines[-1].split()[2]) >= 0.965, lines[-1]
    ## Day 7 on the ladder: the file it saved classifies the repo's photo of a 3
    import predict

    assert predict.main(["--checkpoint", "mnist_minimal.pt", str(REPO / "samples" /
                                                                  "photo_3.jpg")]) == 0
    assert capsys.readouterr().out.splitlines()[1].endswith("photo_3.jpg: 3 (100.0%)")
