"""Model architectures: the paper's sizes, and toy sizes that run forward/backward quickly."""
import pytest
import torch
import torch.nn as nn

from horovod_gravac.harness import models as M


def _fwd_bwd(model, x):
    out = model(x)
    out.float().sum().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    return out


def test_resnet101_is_cifar_style_with_paper_depth():
    m = M.resnet101(num_classes=10)
    assert M.count_parameters(m) == 42_512_970            # CIFAR ResNet101, 10-class head
    assert m.conv1.kernel_size == (3, 3) and m.conv1.stride == (1, 1)
    assert not any(isinstance(x, nn.MaxPool2d) for x in m.modules())
    blocks = [len(getattr(m, f"layer{i}")) for i in range(1, 5)]
    assert blocks == [3, 4, 23, 3]
    bottlenecks = [x for x in m.modules() if isinstance(x, M.Bottleneck)]
    assert 1 + 3 * len(bottlenecks) + 1 == 101              # stem + 3 convs per block + fc
    assert M.resnet101(num_classes=100).fc.out_features == 100


def test_resnet101_toy_forward_backward():
    m = M.resnet101(num_classes=10, width=2)
    out = _fwd_bwd(m, torch.randn(2, 3, 32, 32))
    assert out.shape == (2, 10)
    small = M.build_model("resnet101", num_classes=10, width=4, blocks=[1, 1, 1, 1], in_channels=1)
    assert _fwd_bwd(small, torch.randn(3, 1, 8, 8)).shape == (3, 10)


def test_vgg16_cifar100():
    m = M.vgg16(num_classes=100)
    assert M.count_parameters(m) == 14_770_212
    assert sum(isinstance(x, nn.Conv2d) for x in m.modules()) == 13
    assert sum(isinstance(x, nn.BatchNorm2d) for x in m.modules()) == 13
    assert m.classifier.out_features == 100
    toy = M.vgg16(num_classes=100, width=1 / 16)
    assert _fwd_bwd(toy, torch.randn(2, 3, 32, 32)).shape == (2, 100)
    assert _fwd_bwd(toy, torch.randn(2, 3, 8, 8)).shape == (2, 100)   # small images do not vanish


def test_lstm_paper_size_and_toy_shapes():
    m = M.lstm_lm(10_000)
    assert m.rnn.num_layers == 2 and m.rnn.hidden_size == 1500 and m.encoder.embedding_dim == 1500
    toy = M.build_model("lstm", vocab_size=50, width=16, dropout=0.1)
    h = toy.init_hidden(4)
    assert h[0].shape == (2, 4, 16)
    x = torch.randint(0, 50, (7, 4))
    out, h2 = toy(x, h)
    assert out.shape == (7, 4, 50) and h2[0].shape == (2, 4, 16)
    out.sum().backward()
    h3 = toy.init_hidden(10)                               # eval batch size differs
    assert toy(torch.randint(0, 50, (3, 10)), h3)[0].shape == (3, 10, 50)


def test_tied_weights_share_storage_and_need_equal_sizes():
    m = M.lstm_lm(40, size=8, tie_weights=True)
    assert m.decoder.weight is m.encoder.weight
    assert len(list(m.named_parameters())) == len({id(p) for p in m.parameters()})
    with pytest.raises(ValueError):
        M.LSTMLanguageModel(40, 8, 16, tie_weights=True)


def test_tiny_models():
    cnn = M.build_model("tinycnn", num_classes=10, in_channels=1, image_size=8)
    assert _fwd_bwd(cnn, torch.randn(5, 1, 8, 8)).shape == (5, 10)
    lm = M.build_model("tinylstm", vocab_size=100)
    assert lm.decoder.weight is lm.encoder.weight
    out, _ = lm(torch.randint(0, 100, (4, 3)))
    assert out.shape == (4, 3, 100)


def test_build_model_errors():
    with pytest.raises(ValueError, match="unknown model"):
        M.build_model("alexnet")
    with pytest.raises(ValueError, match="vocab_size"):
        M.build_model("lstm")
    with pytest.raises(ValueError):
        M.ResNet(blocks=[1, 1, 1])
