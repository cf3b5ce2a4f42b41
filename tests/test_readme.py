"""The README's code blocks must run and print what they claim."""

import re
from pathlib import Path

import pytest
import torch
from torch.utils.data import TensorDataset

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text()
USING_COMMON = (REPO / "docs" / "using-common.md").read_text()


def python_block_after(marker: str, text: str = USING_COMMON) -> str:
    """The first ```python block that follows `marker` in `text` (docs/using-common.md)."""
    return re.search(r"```python\n(.*?)```", text[text.index(marker):], re.S).group(1)


def test_the_tensor_snippet_prints_what_its_comments_say(capsys):
    code = python_block_after("### Tensors and autograd")
    exec(compile(code, "README tensor snippet", "exec"), {})
    printed = capsys.readouterr().out.splitlines()
    assert printed == ["torch.Size([2, 3]) torch.int64", "tensor([0.5000, 1.0000])", "10.5",
                       "False", "True", "True"]
    ## each printed line is the one its comment announces
    claimed = [line.split("# ")[1].split(":")[0] for line in code.splitlines()
               if line.startswith("print(")]
    assert claimed == printed


def test_the_autograd_snippet_prints_what_its_comments_say(capsys):
    code = python_block_after("Autograd records what is computed")
    exec(compile(code, "README autograd snippet", "exec"), {})
    printed = capsys.readouterr().out.split("\n")
    claimed = re.findall(r"print\(x\.grad\)\s+# (tensor\(\[[\d.]+\]\))", code)
    assert claimed == ["tensor([7.])", "tensor([11.])"]
    assert printed[:2] == claimed


def zero_linear():
    """A linear model starting from zero: any learning at all shows in its accuracy at once."""
    model = torch.nn.Linear(8, 2)
    torch.nn.init.zeros_(model.weight)
    torch.nn.init.zeros_(model.bias)
    return model


def test_the_reuse_example_trains_and_saves_a_checkpoint(tmp_path, monkeypatch):
    ## The example leaves the data and the model to the reader; give it tiny ones.
    code = python_block_after("## Use `common.py` in your own project")
    monkeypatch.chdir(tmp_path)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2560, 8, generator=g)
    y = (x[:, 0] > 0).long()
    namespace = {"train_set": TensorDataset(x[:2048], y[:2048]),
                 "val_set": TensorDataset(x[2048:], y[2048:]),
                 "MyModel": zero_linear}
    exec(compile(code, "README reuse example", "exec"), namespace)
    assert namespace["best"] > 0.8  # a linear boundary: learnable in 10 epochs
    assert (tmp_path / "best.pt").exists()
    ## the reloaded model is the best one: it scores exactly the best validation accuracy
    reloaded, checkpoint = namespace["model"], namespace["checkpoint"]
    val_x, val_y = x[2048:], y[2048:]
    device = next(reloaded.parameters()).device  # the example may have moved it to a GPU
    assert ((reloaded(val_x.to(device)).argmax(1).cpu() == val_y).float().mean().item() ==
            pytest.approx(namespace["best"], abs=1e-9))
    assert checkpoint["val_accuracy"] == namespace["best"] and 1 <= checkpoint["epoch"] <= 10


def test_the_readme_states_the_measured_accuracy_of_the_default_run():
    ## tests/test_mnist_train.py checks, on real MNIST, that the run reaches this number.
    row = next(line for line in README.splitlines()
               if line.startswith("| `python mnist_train.py --epochs 5` |"))
    stated = float(row.split("|")[2])
    assert f"Test Accuracy: {stated:.4f} ({round(stated * 10000)}/10000)" in README
