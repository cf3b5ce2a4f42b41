"""The README and docs/: their code runs and prints what they claim, their line ranges and links
point where they say, and the README stays a page a learner finishes."""

import ast
import re
import subprocess
from pathlib import Path

import pytest
import torch
from torch.utils.data import TensorDataset

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text()
USING_COMMON = (REPO / "docs" / "using-common.md").read_text()
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def python_block_after(marker: str, text: str = USING_COMMON) -> str:
    """The first ```python block that follows `marker` in `text` (docs/using-common.md)."""
    return re.search(r"```python\n(.*?)```", text[text.index(marker):], re.S).group(1)


def run_the_loop(capsys, swap: bool = False) -> list[float]:
    """The README's closed loop, run as shown (or with backward() and step() swapped); the
    validation accuracy it prints for each epoch."""
    code = python_block_after("## The closed loop first", README)
    if swap:
        backward, step = "loss.backward()", "optimizer.step()"
        assert code.index(backward) < code.index(step)
        code = code.replace(backward, "@").replace(step, backward).replace("@", step)
    exec(compile(code, "README loop", "exec"), {})
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == [f"epoch {e}" for e in range(1, 6)]
    return [float(line.split()[-1]) for line in lines]


def test_the_closed_loop_learns_as_the_readme_shows(capsys):
    accuracy = run_the_loop(capsys)
    assert 0.8 < accuracy[0] < 0.93 and max(accuracy) >= 0.95 and accuracy[-1] > 0.93


def test_the_closed_loop_in_the_wrong_order_runs_but_never_learns(capsys):
    ## step() before backward(): each step sees gradients that zero_grad() has just cleared.
    accuracy = run_the_loop(capsys, swap=True)
    assert len(set(accuracy)) == 1 and accuracy[0] < 0.7  # the untrained model's, every epoch


def test_the_tensor_snippet_prints_what_its_comments_say(capsys):
    code = python_block_after("## Tensors and autograd")
    exec(compile(code, "tensor snippet", "exec"), {})
    printed = capsys.readouterr().out.splitlines()
    assert printed == ["torch.Size([2, 3]) torch.int64", "tensor([0.5000, 1.0000])", "10.5",
                       "False", "9.0", "True"]
    ## each printed line is the one its comment announces
    claimed = [line.split("# ")[1].split(":")[0] for line in code.splitlines()
               if line.startswith("print(")]
    assert claimed == printed


def test_the_autograd_snippet_prints_what_its_comments_say(capsys):
    code = python_block_after("Autograd records what is computed")
    exec(compile(code, "autograd snippet", "exec"), {})
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
                 "val_set": TensorDataset(x[2048:], y[2048:]), "MyModel": zero_linear}
    exec(compile(code, "reuse example", "exec"), namespace)
    assert namespace["best"] > 0.8  # a linear boundary: learnable in 10 epochs
    assert (tmp_path / "best.pt").exists()
    ## the reloaded model is the best one: it scores exactly the best validation accuracy
    reloaded, checkpoint = namespace["model"], namespace["checkpoint"]
    device = next(reloaded.parameters()).device  # the example may have moved it to a GPU
    accuracy = (reloaded(x[2048:].to(device)).argmax(1).cpu() == y[2048:]).float().mean().item()
    assert accuracy == pytest.approx(namespace["best"], abs=1e-9)
    assert checkpoint["val_accuracy"] == namespace["best"] and 1 <= checkpoint["epoch"] <= 10


def test_the_ladder_starts_with_rung_1_and_names_places_that_exist():
    import importlib
    import inspect

    import mnist_train

    files = re.findall(r"^\| \[`(\w+\.py)`\]", README, re.M)
    assert files[:2] == ["mnist_minimal.py", "mnist_train.py"]  # read first, then grown
    table = README[README.index("| growth step |"):]
    rows = table[:table.index("\n\n")].splitlines()[2:]
    assert len(rows) >= 7
    for row in rows:
        for place in re.findall(r"`([^`]+)`", row.split(" | ")[-1]):
            if place.startswith("if "):  # a line of train() itself
                assert place in inspect.getsource(mnist_train.train), place
            else:  # a function: of mnist_train.py, or of the module it names
                module, _, name = place.rpartition(".")
                module = module or "mnist_train"
                if (REPO / "plumbing" / f"{module}.py").exists():  # a module of the kit
                    module = f"plumbing.{module}"
                assert hasattr(importlib.import_module(module), name), place


def test_a_link_named_after_a_function_points_at_its_def():
    ## [`make_schedule`](mnist_train.py#L264-L277) must start at `def make_schedule`.
    links = [(page, *link) for page in PAGES for link in re.findall(
        r"\[`?(?:[\w.]+\.)?(\w+)(?:\(\))?`?\]\(([\w/.]+\.py)#L(\d+)-L(\d+)\)", page.read_text())]
    assert links
    for page, name, file, first, last in links:
        tree = ast.parse((page.parent / file).read_text())
        node = next((n for n in ast.walk(tree) if getattr(n, "name", None) == name), None)
        if node is not None:  # a link named after a step, not a function: its lines exist
            assert (node.lineno, node.end_lineno) == (int(first), int(last)), (name, file)


def test_every_link_of_the_readme_and_docs_resolves():
    def slug(heading: str) -> str:  # GitHub's anchors: lower case, no punctuation, - for space
        return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")

    for page in PAGES:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            file, _, anchor = target.partition("#")
            path = (page.parent / file).resolve() if file else page
            assert path.exists(), (page.name, target)
            if re.fullmatch(r"L\d+(-L\d+)?", anchor):  # lines of a code file
                assert int(anchor.split("-L")[-1].lstrip("L")) <= len(path.read_text().splitlines())
            elif anchor:
                headings = re.findall(r"^#+ (.+)$", path.read_text(), re.M)
                assert anchor in map(slug, headings), (page.name, target)


def test_the_readme_is_a_page_a_learner_finishes_and_names_no_commit():
    assert len(README.splitlines()) <= 250
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout: no commits to compare with")
    for word in set(re.findall(r"\b[0-9a-f]{7,40}\b", README)):
        named = subprocess.run(["git", "cat-file", "-e", f"{word}^{{commit}}"], cwd=REPO,
                               capture_output=True)
        assert named.returncode != 0, word
