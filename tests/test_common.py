import math
import os
import pickle
import re

import pytest
import torch
import torch.nn.functional as F
from helpers import change_a_tensor_on_disk, posix_only
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import common
from plumbing import safeguards


def separable_data(n=512, dim=10, classes=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(classes, dim, generator=g) * 3
    targets = torch.randint(0, classes, (n,), generator=g)
    return centres[targets] + torch.randn(n, dim, generator=g), targets


class Logits(nn.Module):
    """A 'model' whose outputs are its inputs plus a zero bias: the losses are known in advance."""

    def __init__(self, classes):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(classes))

    def forward(self, x):
        return x + self.bias


# reproducibility --------------------------------------------------------------------------------
def test_same_seed_gives_identical_weights_and_shuffles():
    def run(seed):
        g = common.set_seed(seed)
        model = common.build_model("mlp")
        order = list(DataLoader(range(100), batch_size=100, shuffle=True, generator=g))[0]
        return model.fc1.weight.clone(), order, torch.rand(3)

    w1, o1, r1 = run(7)
    w2, o2, r2 = run(7)
    w3, o3, _ = run(8)
    assert torch.equal(w1, w2) and torch.equal(o1, o2) and torch.equal(r1, r2)
    assert not torch.equal(w1, w3) and not torch.equal(o1, o3)


class RandomNumbers(torch.utils.data.Dataset):
    """Each sample is a number from Python's `random`, drawn in whichever process loads it."""

    def __len__(self):
        return 4

    def __getitem__(self, i):
        import random

        return random.random()


def test_set_seeds_generator_makes_python_random_in_workers_repeat():
    ## PyTorch seeds `random` in every worker from the DataLoader's generator, so no
    ## worker_init_fn is needed for reproducible augmentation.
    def draw(seed):
        loader = DataLoader(RandomNumbers(), batch_size=4, num_workers=2,
                            generator=common.set_seed(seed))
        return next(iter(loader)).tolist()

    first = draw(3)
    assert draw(3) == first and draw(4) != first
    assert len(set(first)) == 4  # the two workers draw different numbers


# device -----------------------------------------------------------------------------------------
def test_get_device_cpu_and_auto():
    assert common.get_device("cpu") == torch.device("cpu")
    assert common.get_device("cpu:1") == torch.device("cpu")  # torch.load refuses "cpu:1"
    if not torch.accelerator.is_available():
        assert common.get_device() == torch.device("cpu")


def test_get_device_rejects_unknown_and_unavailable_devices():
    with pytest.raises(ValueError, match="unknown device 'banana'"):
        common.get_device("banana")
    if not torch.accelerator.is_available():
        with pytest.raises(ValueError, match="not available"):
            common.get_device("cuda")


# models -----------------------------------------------------------------------------------------
def test_mlp_is_784_128_64_10_and_ends_in_logits():
    model = common.build_model("mlp")
    shapes = [tuple(m.weight.shape) for m in model.modules() if isinstance(m, nn.Linear)]
    assert shapes == [(128, 784), (64, 128), (10, 64)]
    out = model(torch.randn(5, 1, 28, 28))
    assert out.shape == (5, 10)
    assert not torch.allclose(out.sum(1), torch.ones(5))  # raw logits, no softmax
    ## The names that checkpoints saved by earlier versions hold, whatever the depth.
    assert list(common.build_model("mlp", hidden=[32]).state_dict()) == [
        "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]


def test_cnn_has_two_conv_blocks_and_two_linear_layers():
    model = common.build_model("cnn")
    assert sum(isinstance(m, nn.Conv2d) for m in model.modules()) == 2
    assert sum(isinstance(m, nn.Linear) for m in model.modules()) == 2
    assert model(torch.randn(2, 1, 28, 28)).shape == (2, 10)
    with pytest.raises(ValueError, match="unknown model"):
        common.build_model("resnet")


# training loop ----------------------------------------------------------------------------------
def test_train_one_epoch_lowers_the_loss_on_a_learnable_problem():
    common.set_seed(0)
    x, y = separable_data()
    loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True)
    model = nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 3))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    criterion = nn.CrossEntropyLoss()
    losses = [common.train_one_epoch(model, loader, criterion, optimizer, "cpu", log=None)
              for _ in range(5)]
    assert losses[-1] < 0.3 * losses[0]
    assert evaluate_accuracy(model, x, y) > 0.95


def evaluate_accuracy(model, x, y):
    return common.evaluate(model, [(x, y)], nn.CrossEntropyLoss(), "cpu")[1]


def test_train_one_epoch_averages_per_sample_with_an_uneven_last_batch():
    logits = torch.randn(5, 4) * 3
    targets = torch.tensor([0, 1, 2, 3, 0])
    loader = DataLoader(TensorDataset(logits, targets), batch_size=4)  # batches of 4 and 1
    model = Logits(4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: the losses stay as computed
    got = common.train_one_epoch(model, loader, nn.CrossEntropyLoss(), optimizer, "cpu", log=None)
    per_sample = F.cross_entropy(logits, targets, reduction="none")
    assert got == pytest.approx(per_sample.mean().item(), rel=1e-6)
    assert got != pytest.approx((per_sample[:4].mean() + per_sample[4]).item() / 2, rel=1e-3)


def test_each_step_uses_only_its_own_batch_gradient():
    ## zero_grad -> forward -> backward -> step, by hand, must equal what train_one_epoch does.
    torch.manual_seed(0)
    x, y = separable_data(n=8, dim=3, classes=2)
    batches = [(x[:4], y[:4]), (x[4:], y[4:])]
    model = nn.Linear(3, 2)
    reference = nn.Linear(3, 2)
    reference.load_state_dict(model.state_dict())
    common.train_one_epoch(model, batches, nn.CrossEntropyLoss(),
                           torch.optim.SGD(model.parameters(), lr=0.5), "cpu", log=None)
    for inputs, targets in batches:
        grads = torch.autograd.grad(F.cross_entropy(reference(inputs), targets),
                                    list(reference.parameters()))
        with torch.no_grad():
            for p, g in zip(reference.parameters(), grads):
                p -= 0.5 * g
    for p, q in zip(model.parameters(), reference.parameters()):
        assert torch.allclose(p, q, atol=1e-6)


def test_clip_grad_limits_each_update():
    x, y = separable_data(n=64)
    model = nn.Linear(10, 3)
    before = torch.cat([p.detach().flatten().clone() for p in model.parameters()])
    common.train_one_epoch(model, [(x * 100, y)], nn.CrossEntropyLoss(),
                           torch.optim.SGD(model.parameters(), lr=1.0), "cpu", clip_grad=1e-3,
                           log=None)
    after = torch.cat([p.detach().flatten() for p in model.parameters()])
    assert (after - before).norm() <= 1e-3 + 1e-6  # lr 1 x gradient norm at most 1e-3


def test_bfloat16_autocast_still_learns_on_the_cpu():
    common.set_seed(0)
    x, y = separable_data()
    model = nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 3))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    loader = DataLoader(TensorDataset(x, y), batch_size=32)
    losses = [common.train_one_epoch(model, loader, nn.CrossEntropyLoss(), optimizer, "cpu",
                                     amp_dtype=torch.bfloat16, log=None) for _ in range(4)]
    assert losses[-1] < 0.5 * losses[0]


def test_without_a_scaler_the_loop_trains_exactly_as_the_plain_five_steps():
    ## float32: the disabled GradScaler hands loss.backward() and optimizer.step() through, so
    ## the weights are those of the plain loop of every tutorial, bit for bit.
    x, y = separable_data(n=64)
    model, plain = nn.Linear(10, 3), nn.Linear(10, 3)
    plain.load_state_dict(model.state_dict())
    optimizer, plain_optimizer = (torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, plain))
    steps = []
    optimizer.register_step_post_hook(lambda opt, args, kwargs: steps.append(1))
    common.train_one_epoch(model, DataLoader(TensorDataset(x, y), batch_size=16),
                           nn.CrossEntropyLoss(), optimizer, "cpu", log=None)
    for start in range(0, 64, 16):
        plain_optimizer.zero_grad()
        nn.CrossEntropyLoss()(plain(x[start : start + 16]), y[start : start + 16]).backward()
        plain_optimizer.step()
    assert len(steps) == 4 and torch.equal(model.weight, plain.weight)
    assert torch.equal(model.bias, plain.bias) and not torch.equal(model.bias, torch.zeros(3))


def test_grad_scaler_path_with_clipping_updates_the_weights():
    x, y = separable_data()
    model = nn.Linear(10, 3)
    before = model.weight.detach().clone()
    scaler = torch.amp.GradScaler("cpu")
    loss = common.train_one_epoch(model, [(x, y)], nn.CrossEntropyLoss(),
                                  torch.optim.SGD(model.parameters(), lr=0.1), "cpu",
                                  scaler=scaler, clip_grad=1.0, log=None)
    assert math.isfinite(loss) and not torch.equal(before, model.weight)


def test_training_logs_the_interval_loss_in_the_seed_format():
    x, y = separable_data(n=40)
    lines = []
    common.train_one_epoch(nn.Linear(10, 3), DataLoader(TensorDataset(x, y), batch_size=10),
                           nn.CrossEntropyLoss(), torch.optim.SGD([nn.Parameter(torch.zeros(1))],
                                                                  lr=0.1),
                           "cpu", epoch=3, log_interval=2, log=lines.append)
    assert len(lines) == 2
    assert lines[0].startswith("Epoch 3 | Batch 2/4 | Loss ")


def test_a_loader_without_a_length_trains_and_logs():
    x, y = separable_data(n=40)
    batches = ((x[i : i + 10], y[i : i + 10]) for i in range(0, 40, 10))  # a generator: no len()
    lines = []
    loss = common.train_one_epoch(nn.Linear(10, 3), batches, nn.CrossEntropyLoss(),
                                  torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1), "cpu",
                                  log_interval=2, log=lines.append)
    assert math.isfinite(loss)
    assert [line.split(" | Loss")[0] for line in lines] == ["Epoch 1 | Batch 2/?",
                                                            "Epoch 1 | Batch 4/?"]


def test_a_nan_loss_stops_training_with_advice_true_in_any_project():
    model = nn.Linear(10, 3)
    with torch.no_grad():
        model.weight.fill_(float("nan"))
    x, y = separable_data(n=16)
    with pytest.raises(FloatingPointError, match=r"lower learning rate.*clipping") as err:
        common.train_one_epoch(model, [(x, y)], nn.CrossEntropyLoss(),
                               torch.optim.SGD(model.parameters(), lr=0.1), "cpu", log=None)
    assert "--" not in str(err.value) and ".py" not in str(err.value)  # no flag, no file of ours


def test_a_nan_loss_shows_in_the_log_line_and_ends_the_epoch_with_an_error():
    x, y = separable_data(n=64)
    batches = [(x[i : i + 4], y[i : i + 4]) for i in range(0, 64, 4)]  # 16 batches
    batches[2] = (torch.full_like(batches[2][0], float("nan")), batches[2][1])
    lines = []
    with pytest.raises(FloatingPointError, match="became nan in epoch 7"):
        common.train_one_epoch(nn.Linear(10, 3), batches, nn.CrossEntropyLoss(),
                               torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1), "cpu",
                               epoch=7, log_interval=2, log=lines.append)
    losses = [line.split()[-1] for line in lines]  # logged at batches 2, 4, ..., 16
    assert len(losses) == 8 and losses[0] != "nan" and losses[1:] == ["nan"] * 7


def test_bad_labels_get_pytorchs_readable_error_in_the_loop_and_ours_at_load_time(
        tiny_mnist_copy):
    from conftest import write_idx

    x, y = separable_data(n=8)
    y[5] = 3  # three classes: 0..2
    with pytest.raises(IndexError, match="Target 3 is out of bounds"):
        common.train_one_epoch(nn.Linear(10, 3), [(x, y)], nn.CrossEntropyLoss(),
                               torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1), "cpu",
                               log=None)
    ## Labels 1..10 instead of 0..9: refused where the data is loaded, naming the first one.
    labels = tiny_mnist_copy / "MNIST" / "raw" / "t10k-labels-idx1-ubyte"
    write_idx(labels, common.read_idx(labels) + 1)
    with pytest.raises(common.DataError, match=rf"label 10 at position 9 of {labels} is "
                       r"outside 0\.\.9: class labels must be 0 to C-1 \(remap 1\.\.10"):
        common.load_mnist(tiny_mnist_copy, train=False)


def test_nan_inputs_give_a_nan_validation_loss_and_stop_training():
    x, y = separable_data(n=8)
    x[6, 2] = float("nan")
    loss, _ = common.evaluate(nn.Linear(10, 3), [(x, y)], nn.CrossEntropyLoss(), "cpu")
    assert math.isnan(loss)  # evaluate reports it; the README's troubleshooting table explains
    with pytest.raises(FloatingPointError, match="check inputs for NaN or inf"):
        common.train_one_epoch(nn.Linear(10, 3), [(x, y)], nn.CrossEntropyLoss(),
                               torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1), "cpu",
                               log=None)


def test_an_empty_loader_is_a_clear_error():
    with pytest.raises(ValueError, match="no batches"):
        common.train_one_epoch(nn.Linear(2, 2), [], nn.CrossEntropyLoss(),
                               torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1), "cpu")
    with pytest.raises(ValueError, match="no batches"):
        common.evaluate(nn.Linear(2, 2), [], nn.CrossEntropyLoss(), "cpu")


## A script that pastes each piece alone, after the docstring's imports: exec() runs each one in
## a namespace of its own, which holds those imports and nothing else, so a name the piece
## needs and the imports lack fails as it would in the reader's own file.
PASTED_ALONE = """
from torch.utils.data import DataLoader, TensorDataset

IMPORTS, SOURCES = {imports!r}, {sources!r}


def paste(name):
    namespace = {{}}
    exec(IMPORTS + "\\n\\n" + SOURCES[name], namespace)
    return namespace[name]


set_seed, get_device, MLP, CNN, train_one_epoch, evaluate = map(paste, SOURCES)
import torch
from torch import nn

g = set_seed(0)  # a seeded generator, for the DataLoader's shuffle
assert get_device("auto") == get_device() and get_device("cpu") == torch.device("cpu")
digits = torch.randn(2, 1, 28, 28)
assert MLP()(digits).shape == CNN()(digits).shape == (2, 10)
x = torch.randn(600, 5, generator=g)
y = (x[:, 0] + x[:, 1] > 0).long()  # two classes
train = DataLoader(TensorDataset(x[:500], y[:500]), batch_size=32, shuffle=True, generator=g)
val = DataLoader(TensorDataset(x[500:], y[500:]), batch_size=64)
model = nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, 0.2, total_steps=3 * len(train))
for epoch in (1, 2, 3):
    loss = train_one_epoch(model, train, nn.CrossEntropyLoss(), optimizer, "cpu", epoch=epoch,
                           log_interval=8, clip_grad=1.0, scheduler=scheduler,
                           amp_dtype=torch.bfloat16 if epoch == 3 else None)
print("accuracy", evaluate(model, val, nn.CrossEntropyLoss(), torch.device("cpu"))[1])
"""


def test_the_lesson_pieces_run_pasted_alone_after_the_docstrings_imports(capsys):
    import inspect
    import itertools

    ## The indented import lines of common.py's docstring, after "starts with these imports".
    after = common.__doc__.split("starts with these imports")[1].splitlines()[1:]
    block = itertools.takewhile(lambda line: not line or line.startswith("    "), after)
    imports = "\n".join(line.strip() for line in block).strip()
    assert imports.startswith("import math") and imports.endswith("from torch import nn")
    pieces = (common.set_seed, common.get_device, common.MLP, common.CNN,
              common.train_one_epoch, common.evaluate)
    sources = {piece.__name__: inspect.getsource(piece) for piece in pieces}
    exec(PASTED_ALONE.format(imports=imports, sources=sources), {"__name__": "__main__"})
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "Epoch 1 | Batch 8/16 | Loss " + lines[0].split()[-1]
    assert float(lines[-1].split()[1]) > 0.9


def test_train_one_epoch_fits_on_one_screen():
    import inspect

    ## With the plain float32 path and the GradScaler path side by side, in about 50 lines.
    source = inspect.getsource(common.train_one_epoch)
    assert len(source.splitlines()) <= 50


def test_evaluate_is_exact_on_a_hand_built_case_and_leaves_no_gradients():
    logits = torch.tensor([[2.0, 0.0, 0.0], [0.0, 3.0, 0.0], [1.0, 0.0, 4.0], [0.0, 5.0, 0.0]])
    targets = torch.tensor([0, 1, 0, 2])  # right, right, wrong, wrong
    model = Logits(3)
    model.train()
    loader = DataLoader(TensorDataset(logits, targets), batch_size=3)  # batches of 3 and 1
    loss, acc = common.evaluate(model, loader, nn.CrossEntropyLoss(), "cpu")
    expected = sum(math.log(sum(math.exp(v) for v in row)) - row[t]
                   for row, t in zip(logits.tolist(), targets.tolist())) / 4
    assert acc == 0.5
    assert loss == pytest.approx(expected, rel=1e-6)
    assert model.bias.grad is None and not model.training


@pytest.mark.parametrize("outputs, targets", [
    (torch.zeros(4, 1), torch.zeros(4, 1)),  # one logit per sample (BCEWithLogitsLoss)
    (torch.zeros(4, 3, 5), torch.zeros(4, 5, dtype=torch.long)),  # a class per time step
])
def test_evaluate_refuses_shapes_whose_accuracy_would_mean_nothing(outputs, targets):
    ## Broadcasting would compare every sample with every target: "accuracy" 4.0, no error.
    loader = [(outputs, targets)]
    with pytest.raises(ValueError, match=r"needs outputs \[batch, classes\] and class numbers "
                       r"\[batch\], not \[4, "):
        common.evaluate(nn.Identity(), loader, lambda o, t: o.sum() * 0, "cpu")


def test_evaluate_switches_dropout_off():
    model = nn.Sequential(nn.Dropout(0.9), nn.Linear(10, 3))
    x, y = separable_data(n=64)
    first = common.evaluate(model, [(x, y)], nn.CrossEntropyLoss(), "cpu")
    assert common.evaluate(model, [(x, y)], nn.CrossEntropyLoss(), "cpu") == first


# in-memory loader -------------------------------------------------------------------------------
def test_tensor_loader_visits_every_sample_once_in_a_new_order_each_epoch():
    x = torch.arange(103).float()[:, None]
    loader = common.TensorLoader(x, torch.arange(103), batch_size=10, shuffle=True, seed=1)
    epochs = [torch.cat([t for _, t in loader]) for _ in range(2)]
    assert len(loader) == 11 and [len(t) for _, t in loader][-1] == 3
    for order in epochs:
        assert sorted(order.tolist()) == list(range(103))
    assert not torch.equal(epochs[0], epochs[1])
    loader.set_epoch(0)
    assert torch.equal(torch.cat([t for _, t in loader]), epochs[0])  # set_epoch replays an epoch
    inputs, targets = next(iter(loader))
    assert torch.equal(inputs[:, 0].long(), targets)  # inputs and targets stay paired


@pytest.mark.parametrize("n, world", [(23, 3), (24, 3), (2, 8), (1, 4)])  # last two: more
def test_tensor_loader_shards_like_distributed_sampler(n, world, monkeypatch):  # processes
    from torch.utils.data import DistributedSampler  # than samples

    data = torch.arange(n)
    shards = []
    monkeypatch.setattr(common, "process_count", lambda: world)  # as torchrun's processes see it
    for rank in range(world):
        monkeypatch.setattr(common, "process_rank", lambda: rank)  # noqa: B023
        loader = common.TensorLoader(data, data, batch_size=100, shuffle=True, seed=5)
        loader.set_epoch(2)
        sampler = DistributedSampler(range(n), num_replicas=world, rank=rank, seed=5)
        sampler.set_epoch(2)
        shard = next(iter(loader))[1]
        assert shard.tolist() == list(sampler)  # the very same indices
        assert len(list(loader)) == len(loader) == 1  # as many batches in each, or DDP hangs
        shards.append(shard)
        ## evaluation (not shuffled): every sample, in every process
        assert torch.cat([t for _, t in common.TensorLoader(data, data, 5)]).tolist() == list(
            range(n))
    assert {len(s) for s in shards} == {-(-n // world)}
    assert set(torch.cat(shards).tolist()) == set(range(n))


# checkpoints ------------------------------------------------------------------------------------
def save(path, model, name="mlp"):
    common.save_checkpoint(path, model, model_name=name, mean=0.1307, std=0.3081, epoch=3,
                           val_accuracy=0.97)


def test_checkpoint_round_trip_gives_identical_outputs(tmp_path):
    common.set_seed(0)
    model = common.build_model("cnn").eval()
    save(tmp_path / "ck" / "best.pt", model, "cnn")
    loaded, checkpoint = common.load_model(tmp_path / "ck" / "best.pt")
    x = torch.randn(4, 1, 28, 28)
    assert torch.equal(model(x), loaded(x))
    assert checkpoint["epoch"] == 3 and checkpoint["mean"] == 0.1307
    assert checkpoint["model_name"] == "cnn" and checkpoint["val_accuracy"] == 0.97
    assert os.listdir(tmp_path / "ck") == ["best.pt"]  # no temporary file left behind


def test_a_value_load_checkpoint_would_refuse_is_refused_when_saving(tmp_path):
    ## A Path among the extras would save, then fail at every load as "could run code".
    with pytest.raises(TypeError, match=r"this one holds pathlib\.\w*Path: convert it"):
        common.save_checkpoint(tmp_path / "m.pt", nn.Linear(2, 2), model_name="mlp", mean=0.0,
                               std=1.0, epoch=1, val_accuracy=0.5, data_dir=tmp_path)
    assert not (tmp_path / "m.pt").exists()
    common.save_checkpoint(tmp_path / "m.pt", nn.Linear(2, 2), model_name="mlp", mean=0.0,
                           std=1.0, epoch=1, val_accuracy=0.5, data_dir=str(tmp_path),
                           sizes={"hidden": (4, 2)})  # plain values, tuples included: saved
    assert common.load_checkpoint(tmp_path / "m.pt")["data_dir"] == str(tmp_path)


def test_checkpoint_of_a_wrapped_model_has_no_prefix(tmp_path):
    ## DataParallel keeps the real model in .module, as DistributedDataParallel does.
    save(tmp_path / "w.pt", nn.DataParallel(common.build_model("mlp")))
    assert "fc1.weight" in common.load_checkpoint(tmp_path / "w.pt")["state_dict"]
    compiled = torch.compile(common.build_model("mlp"))  # wraps it: keys start with _orig_mod.
    save(tmp_path / "c.pt", compiled)
    assert "fc1.weight" in common.load_checkpoint(tmp_path / "c.pt")["state_dict"]

    class Mine(nn.Module):  # a user's model whose own layer happens to be called "module"
        def __init__(self):
            super().__init__()
            self.module = nn.Linear(2, 2)

    save(tmp_path / "m.pt", Mine())
    assert "module.weight" in common.load_checkpoint(tmp_path / "m.pt")["state_dict"]


@posix_only
def test_a_name_too_long_for_the_temporary_file_is_one_output_error(tmp_path):
    with pytest.raises(common.OutputError, match="File name too long"):
        common.write_atomically(tmp_path / ("x" * 250), b"data")  # fits; its temporary does not
    assert list(tmp_path.iterdir()) == []


def test_interrupted_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "best.pt"
    save(path, common.build_model("mlp"))
    original = path.read_bytes()

    def write_half_then_interrupt(*args):
        raise KeyboardInterrupt  # as Ctrl-C would, in the middle of the write

    monkeypatch.setattr(common.os, "fsync", write_half_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        save(path, common.build_model("mlp"))
    assert path.read_bytes() == original
    assert os.listdir(tmp_path) == ["best.pt"]  # and no temporary file left behind


def test_a_checkpoint_that_would_run_code_is_refused_and_the_code_never_runs(tmp_path):
    marker = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    evil = tmp_path / "evil.pt"
    torch.save({"model_name": "mlp", "state_dict": {}, "mean": 0.0, "std": 1.0, "x": Exploit()},
               evil)
    with pytest.raises(common.CheckpointError, match=f"refused to load {evil}.*could run code"):
        common.load_checkpoint(evil)
    assert not marker.exists()


@pytest.mark.parametrize("name, content, message", [
    ("bad.pt", b"", "is not a checkpoint saved by this repo$"),
    ("bad.pt", b"this is a text file, not a checkpoint", "is not a checkpoint saved by this repo$"),
    ("bad.pt", pickle.dumps([1, 2, 3]), "is not a checkpoint saved by this repo$"),
    ("list.pt", "torch.save", "is a PyTorch file but not a checkpoint of this repo"),
    ("digit.png", b"\x89PNG\r\n\x1a\n", "is not a checkpoint saved by this repo$"),
])
def test_files_that_are_not_checkpoints_are_named_in_the_error(tmp_path, name, content, message):
    path = tmp_path / name
    if content == "torch.save":
        torch.save([1, 2, 3], path)
    else:
        path.write_bytes(content)
    with pytest.raises(common.CheckpointError, match=message) as err:
        common.load_model(path)
    assert str(err.value).startswith(str(path)) and "weights_only" not in str(err.value)


@pytest.mark.parametrize("damage", ["cut short", "a changed byte", "a changed length"])
def test_a_checkpoint_cut_short_or_changed_after_saving_is_refused(tmp_path, damage):
    path = tmp_path / "best.pt"
    save(path, common.build_model("mlp"))
    if damage == "cut short":
        path.write_bytes(path.read_bytes()[:5000])
    else:  # torch.load itself would read these, with wrong weights: its archive's checksums tell
        change_a_tensor_on_disk(path, "data" if damage == "a changed byte" else "header")
        torch.load(path, weights_only=True)
    with pytest.raises(common.CheckpointError, match=f"^{re.escape(str(path))} is cut short or "
                       "damaged .*: use a good copy, or train again$"):
        common.load_model(path)


def test_a_checkpoint_saved_without_checksums_still_loads(tmp_path):
    ## torch.serialization.set_crc32_options(False) leaves every checksum at 0: nothing to check.
    before = torch.serialization.get_crc32_options()
    torch.serialization.set_crc32_options(False)
    model = common.build_model("mlp")
    try:
        save(tmp_path / "best.pt", model)
    finally:
        torch.serialization.set_crc32_options(before)
    loaded, _ = common.load_model(tmp_path / "best.pt")
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(),
                                                 model.state_dict().values(), strict=True))


def test_checkpoints_for_other_models_are_refused(tmp_path):
    torch.save(common.build_model("mlp").state_dict(), tmp_path / "bare.pt")
    with pytest.raises(common.CheckpointError, match="needs the keys model_name, state_dict"):
        common.load_model(tmp_path / "bare.pt")
    save(tmp_path / "mismatch.pt", common.build_model("mlp"), name="cnn")
    ## PyTorch's message starts with a heading line; the first line that says what differs
    ## is the one shown.
    with pytest.raises(common.CheckpointError, match=r"does not fit the 'cnn' model that this "
                       r"code defines \(Missing key\(s\) in state_dict: \"conv1\.weight\""):
        common.load_model(tmp_path / "mismatch.pt")
    save(tmp_path / "wide.pt", common.build_model("mlp", hidden=[256, 64]))
    with pytest.raises(common.CheckpointError, match=r"\(size mismatch for fc1\.weight: copying "
                       r"a param with shape torch\.Size\(\[256, 784\]\) from checkpoint"):
        common.load_model(tmp_path / "wide.pt")
    save(tmp_path / "unknown.pt", nn.Linear(2, 2), name="resnet")
    with pytest.raises(common.CheckpointError, match="'resnet' model .*unknown model 'resnet'"):
        common.load_model(tmp_path / "unknown.pt")
    with pytest.raises(common.CheckpointError, match="does not exist"):
        common.load_model(tmp_path / "missing.pt")
    with pytest.raises(common.CheckpointError, match="is a folder, a device or a pipe, not a"):
        common.load_model(tmp_path)


@pytest.mark.parametrize("values", [{"std": 0.0}, {"mean": float("nan")}, {"std": "0.3"},
                                    {"classes": ["a", "b"]}, {"classes": list(range(10))}])
def test_a_hand_made_checkpoint_with_unusable_values_is_refused_when_loaded(tmp_path, values):
    ## Such values would otherwise fail later, one picture at a time (a std of 0: nan%).
    save(tmp_path / "good.pt", common.build_model("mlp"))
    checkpoint = torch.load(tmp_path / "good.pt", weights_only=True)
    torch.save({**checkpoint, **values}, tmp_path / "hand_made.pt")
    with pytest.raises(common.CheckpointError, match="values this code cannot use"):
        common.load_model(tmp_path / "hand_made.pt")
    common.load_model(tmp_path / "good.pt")  # the same checkpoint, unchanged, loads


# MNIST files ------------------------------------------------------------------------------------
def test_load_mnist_reads_idx_files_as_torchvision_does(tiny_mnist):
    from torchvision import datasets

    images, labels = common.load_mnist(tiny_mnist, train=False)
    theirs = datasets.MNIST(tiny_mnist, train=False, download=False)
    assert images.dtype == torch.uint8 and labels.dtype == torch.int64
    assert torch.equal(images, theirs.data) and torch.equal(labels, theirs.targets)


@pytest.mark.parametrize("given", ["MNIST", "MNIST/raw"])
def test_a_data_folder_one_level_too_deep_gets_the_right_one_named(tiny_mnist, given):
    with pytest.raises(common.DataError) as err:
        safeguards.download_mnist(tiny_mnist / given, "MNIST")
    assert str(err.value) == (
        f"MNIST is not in {tiny_mnist / given / 'MNIST' / 'raw'}/, but its files are in "
        f"{tiny_mnist / 'MNIST' / 'raw'}/: give {tiny_mnist} as the data folder (it holds "
        "MNIST/raw/)")


def test_images_and_labels_that_do_not_go_together_are_refused(tiny_mnist_copy):
    from conftest import write_idx

    raw = tiny_mnist_copy / "MNIST" / "raw"
    write_idx(raw / "t10k-labels-idx1-ubyte", torch.zeros(199, dtype=torch.uint8))
    with pytest.raises(common.DataError, match=r"hold \[200, 28, 28\] images and \[199\] "
                       "labels, where N x 28 x 28 and N .* delete both"):
        common.load_mnist(tiny_mnist_copy, train=False)
    write_idx(raw / "t10k-images-idx3-ubyte", torch.zeros(0, 28, 28, dtype=torch.uint8))
    write_idx(raw / "t10k-labels-idx1-ubyte", torch.zeros(0, dtype=torch.uint8))
    with pytest.raises(common.DataError, match=r"t10k-images-idx3-ubyte is damaged"):
        common.load_mnist(tiny_mnist_copy, train=False)


def test_a_damaged_idx_file_is_named_with_the_fix(tiny_mnist_copy, tmp_path):
    path = tiny_mnist_copy / "MNIST" / "raw" / "train-images-idx3-ubyte"
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(common.DataError, match=f"{path} is damaged or cut short .*Delete it"):
        common.load_mnist(tiny_mnist_copy, train=True)
    (tmp_path / "text").write_bytes(b"not an IDX file")
    ## A damaged header that promises 3 x (2**32 - 1) bytes is refused before any is allocated.
    (tmp_path / "huge").write_bytes(b"\x00\x00\x08\x03" + b"\xff" * 12 + b"abc")
    for name in ("text", "huge"):
        with pytest.raises(common.DataError, match=f"{name} is damaged"):
            common.read_idx(tmp_path / name)
    (tmp_path / "whole").write_bytes(b"\x00\x00\x08\x01" + (3).to_bytes(4, "big") + b"abc")
    assert common.read_idx(tmp_path / "whole").tolist() == [97, 98, 99]


def test_mnist_files_that_cannot_be_read_are_one_line(tiny_mnist_copy, monkeypatch):
    label_file = tiny_mnist_copy / "MNIST" / "raw" / "t10k-labels-idx1-ubyte"
    label_file.unlink()
    label_file.mkdir()  # a folder where the file belongs
    with pytest.raises(common.DataError, match=f"^{re.escape(str(label_file))} cannot be read: "):
        common.load_mnist(tiny_mnist_copy, train=False)

    def refuse(*args, **kwargs):  # root reads everything, so the refusal is simulated
        raise PermissionError(13, "Permission denied", str(args[0]))

    monkeypatch.setattr("builtins.open", refuse)
    with pytest.raises(common.DataError, match="cannot be read: Permission denied$"):
        common.load_mnist(tiny_mnist_copy, train=True)


def test_missing_mnist_offline_says_which_folder_and_leaves_no_empty_folders(tmp_path,
                                                                           no_network):
    with pytest.raises(common.DataError) as err:
        safeguards.download_mnist(tmp_path / "typo" / "data", "MNIST")
    message = str(err.value)
    assert f"MNIST is not in {tmp_path / 'typo' / 'data' / 'MNIST' / 'raw'}/" in message
    assert "online" in message and "unpacked" in message and "gunzip" in message
    ## the reason is the mirror's own answer, not an empty "Error downloading ...:"
    assert "downloading it failed: <urlopen error" in message and ":." not in message
    assert not (tmp_path / "typo").exists()
    ## a data folder that is a file: the same one line, with the reason
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(common.DataError, match="downloading it failed: .*otes.txt"):
        safeguards.download_mnist(tmp_path / "notes.txt", "MNIST")
    ## load_mnist itself downloads nothing: it says where the files belong.
    with pytest.raises(common.DataError, match=f"MNIST is not in {tmp_path / 'MNIST' / 'raw'}/: "
                       "put its four files there"):
        common.load_mnist(tmp_path)


def test_a_damaged_gz_file_is_named_as_the_likely_cause(tmp_path, no_network):
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    (raw / "train-images-idx3-ubyte.gz").write_bytes(b"\x1f\x8b not really gzip")
    with pytest.raises(common.DataError, match="gunzip -k a .gz that torchvision"):
        safeguards.download_mnist(tmp_path, "MNIST")


# writing files whole ---------------------------------------------------------------------------
@posix_only
@pytest.mark.parametrize("kind", ["fifo", "link to a fifo", "directory"])
def test_saving_never_replaces_anything_but_a_regular_file(tmp_path, kind):
    ## A FIFO stands in for /dev/null: os.replace would turn either into a regular file.
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    names = {"fifo": "fifo", "link to a fifo": "link", "directory": "dir"}
    target = tmp_path / names[kind]
    if kind == "link to a fifo":
        target.symlink_to(fifo)
    if kind == "directory":
        target.mkdir()
    with pytest.raises(common.OutputError, match="is not a regular file, and will not be replaced"):
        save(target, common.build_model("mlp"))
    assert fifo.is_fifo() and (kind != "directory" or target.is_dir())
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted({"fifo", names[kind]})


def test_a_write_error_partway_keeps_the_old_file_and_leaves_no_temporary_file(tmp_path,
                                                                             monkeypatch):
    import builtins
    import errno

    path = tmp_path / "best.pt"
    save(path, common.build_model("mlp"))
    original = path.read_bytes()

    class FullDisk:  # a file whose disk fills up after 1,000 bytes
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, data):
            self.f.write(data[:1000])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(common, "open", lambda *args: FullDisk(builtins.open(*args)),
                        raising=False)
    with pytest.raises(common.OutputError,
                       match=f"could not write {path}: No space left on device"):
        save(path, common.build_model("cnn"), "cnn")
    assert path.read_bytes() == original and os.listdir(tmp_path) == ["best.pt"]


def test_a_file_another_program_holds_for_a_moment_is_written_after_a_retry(tmp_path,
                                                                           monkeypatch):
    ## Windows: os.replace fails with PermissionError while a virus scanner has the file open.
    real, calls = os.replace, []

    def busy_twice(source, target):
        calls.append(target)
        if len(calls) <= 2:
            raise PermissionError(13, "Access is denied")
        real(source, target)

    monkeypatch.setattr(common.os, "replace", busy_twice)
    common.write_atomically(tmp_path / "m.csv", b"epoch\n1\n")
    assert len(calls) == 3 and (tmp_path / "m.csv").read_bytes() == b"epoch\n1\n"


def test_a_file_another_program_keeps_open_is_named_with_what_to_do(tmp_path, monkeypatch):
    (tmp_path / "m.csv").write_bytes(b"old")

    def always_busy(source, target):
        raise PermissionError(13, "Access is denied")

    monkeypatch.setattr(common.os, "replace", always_busy)
    monkeypatch.setattr(common.time, "sleep", lambda seconds: None)
    monkeypatch.setattr(common.sys, "platform", "win32")
    with pytest.raises(common.OutputError) as err:
        common.write_atomically(tmp_path / "m.csv", b"new")
    assert str(err.value).startswith(f"could not write {tmp_path / 'm.csv'}: Access is denied. "
                                     "On Windows this means another program holds the file open")
    monkeypatch.setattr(common.sys, "platform", "linux")  # there, a plain permission problem
    with pytest.raises(common.OutputError) as err:
        common.write_atomically(tmp_path / "m.csv", b"new")
    assert "another program" not in str(err.value)
    assert (tmp_path / "m.csv").read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.csv"]  # no temporary file left
