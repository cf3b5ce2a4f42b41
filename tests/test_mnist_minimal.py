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
    lines = run(monkeypatch, capsys, "--data-dir", str(tiny_mnist), "--epochs", "3")
    scores = [line for line in lines if line.startswith("Test Accuracy: ")]
    assert len(scores) == 3 and lines[-1] == scores[-1]  # it ends with a Test Accuracy line
    accuracies = [float(line.split()[2]) for line in scores]
    ## The weights saved are those of the best epoch: they score what that epoch printed.
    model = mnist_minimal.MLP()
    model.load_state_dict(torch.load(tmp_path / "mnist_minimal.pt", weights_only=True))
    correct, total = mnist_minimal.test(model, mnist_minimal.load_data(str(tiny_mnist))[1], "cpu")
    assert total == 200 and correct / total == pytest.approx(max(accuracies), abs=1e-4)
    assert max(accuracies) > 0.3  # chance is 0.1: it learned


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
