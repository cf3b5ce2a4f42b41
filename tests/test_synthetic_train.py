import math

import pytest
import torch
from torch import nn

import synthetic_train


def test_the_dataset_is_a_map_style_dataset_with_integer_labels():
    data = synthetic_train.ClusterDataset(100, input_dim=20, num_classes=4, seed=1)
    assert len(data) == 100
    x, y = data[3]
    assert x.shape == (20,) and x.dtype == torch.float32 and y.dtype == torch.int64
    assert set(data.labels.tolist()) == {0, 1, 2, 3}
    again = synthetic_train.ClusterDataset(100, input_dim=20, num_classes=4, seed=1)
    assert torch.equal(again.samples, data.samples)


def test_simple_classifier_uses_xavier_init_and_zero_bias():
    torch.manual_seed(0)
    model = synthetic_train.SimpleClassifier(20, 512, 4)
    bound = math.sqrt(6 / (20 + 512))  # Xavier-uniform limit for fan_in 20, fan_out 512
    assert model.fc1.weight.abs().max() <= bound
    assert model.fc1.weight.abs().max() > 0.95 * bound  # not PyTorch's default, which is smaller
    assert torch.all(model.fc1.bias == 0) and torch.all(model.fc2.bias == 0)
    assert isinstance(model.relu, nn.ReLU)


def test_training_lowers_the_loss_and_raises_accuracy_with_warmup_then_cosine(monkeypatch,
                                                                              capsys):
    assert synthetic_train.main(["--epochs", "6", "--samples", "2000"]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("epoch")]
    assert len(lines) == 6

    def field(line, name):
        return float(line.split(name)[1].split("|")[0])

    losses = [field(ln, "train loss") for ln in lines]
    accs = [field(ln, "val acc") for ln in lines]
    lrs = [field(ln, "lr") for ln in lines]
    assert losses[-1] < 0.7 * losses[0] and accs[-1] > accs[0] + 0.1 and accs[-1] > 0.75
    assert lrs[0] == pytest.approx(1e-3)  # end of warmup: the peak learning rate
    assert lrs[0] > lrs[2] > lrs[4] > lrs[5] and lrs[5] < 1e-5  # cosine decay towards zero


def test_a_diverging_run_ends_with_one_line_and_exit_code_1(capsys):
    assert synthetic_train.main(["--lr", "1e30", "--clip-grad", "1e30", "--epochs", "1",
                                 "--samples", "256"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: the training loss became nan in epoch 1")
    assert len(err.strip().splitlines()) == 1 and "--lr" in err


@pytest.mark.parametrize("args, message", [
    (["--lr", "inf"], "--lr: expected a number above 0 and at most 1e30, got 'inf'"),
    (["--lr", "1e39"], "--lr: expected a number above 0 and at most 1e30, got '1e39'"),
    (["--clip-grad", "nan"], "--clip-grad: expected a number above 0 and at most 1e30, got 'nan"),
    (["--epochs", "0"], "--epochs: expected a whole number above 0 and at most"),
    (["--num-workers", "-1"], "--num-workers: expected a whole number from 0 to 64"),
    (["--num-workers", "100000"], "--num-workers: expected a whole number from 0 to 64"),
    (["--samples", "3"], "--samples: expected a whole number from 4 to 2147483647, got '3'"),
    (["--num-classes", "1"], "--num-classes: expected a whole number from 2 to 2147483647"),
    (["--warmup-epochs", "nan"], "--warmup-epochs must be from 0 to --epochs (10)"),
    (["--warmup-epochs", "-1"], "--warmup-epochs must be from 0 to --epochs (10)"),
    (["--epochs", "2", "--warmup-epochs", "5"], "--warmup-epochs must be from 0 to --epochs (2)"),
    (["--seed", "-1"], "--seed: expected a whole number from 0 to 4294967295, got '-1'"),
])
def test_bad_settings_are_usage_errors_before_any_work(monkeypatch, capsys, args, message):
    with pytest.raises(SystemExit) as exit_:
        synthetic_train.main(args)
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_a_warmup_as_long_as_the_run_gets_a_note(monkeypatch, capsys):
    synthetic_train.main(["--epochs", "1", "--samples", "400"])  # --warmup-epochs 1: the default
    assert "note: the warmup takes all 1 epochs" in capsys.readouterr().out


def test_dataloader_workers_start_under_spawn_as_on_windows_and_macos(monkeypatch, capsys):
    ## Windows and macOS start DataLoader workers with "spawn": a new Python that gets the
    ## Dataset by pickling, so it must be a class of a module, not a local object.
    import torch.multiprocessing

    start_method = torch.multiprocessing.get_start_method()
    torch.multiprocessing.set_start_method("spawn", force=True)
    try:
        assert synthetic_train.main(["--epochs", "1", "--samples", "200", "--num-workers",
                                     "1"]) == 0
    finally:
        torch.multiprocessing.set_start_method(start_method, force=True)
    assert "val acc" in capsys.readouterr().out

