import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import common
from plumbing import files


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
    scalers = []

    class Recorded(torch.amp.GradScaler):  # an enabled one would give the same weights too
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            scalers.append(self)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.amp, "GradScaler", Recorded)
        common.train_one_epoch(model, DataLoader(TensorDataset(x, y), batch_size=16),
                               nn.CrossEntropyLoss(), optimizer, "cpu", log=None)
    assert len(scalers) == 1 and not scalers[0].is_enabled()  # float32: no scaling at all
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
    write_idx(labels, files.read_idx(labels) + 1)
    with pytest.raises(files.DataError, match=rf"label 10 at position 9 of {labels} is "
                       r"outside 0\.\.9: class labels must be 0 to C-1 \(remap 1\.\.10"):
        files.load_mnist(tiny_mnist_copy, train=False)


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
