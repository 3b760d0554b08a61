from __future__ import annotations

import torch

from sembridge_ray.siamese.model import MaLSTM, pad_to, to_score


def _model(seed: int = 0) -> MaLSTM:
    g = torch.Generator().manual_seed(seed)
    emb = torch.randn(20, 8, generator=g)
    emb[0] = 0
    return MaLSTM(emb, hidden=5, generator=g).eval()


def _batch() -> tuple[torch.Tensor, ...]:
    ids_a = torch.tensor([[1, 2, 3, 0], [4, 5, 0, 0]])
    ids_b = torch.tensor([[6, 7, 0], [8, 9, 10]])
    return ids_a, torch.tensor([3, 2]), ids_b, torch.tensor([2, 3])


def test_one_lstm_is_shared_by_both_sides() -> None:
    model = _model()
    assert sum(isinstance(m, torch.nn.LSTM) for m in model.modules()) == 1
    a, la, b, lb = _batch()
    with torch.no_grad():
        assert torch.allclose(model(a, la, b, lb), model(b, lb, a, la))  # symmetric
        # same sentence -> 5
        assert torch.allclose(to_score(model(a, la, a, la)), torch.full((2,), 5.0))


def test_padding_and_batch_company_do_not_change_the_prediction() -> None:
    model = _model()
    a, la, b, lb = _batch()
    with torch.no_grad():
        base = model(a, la, b, lb)
        padded = model(pad_to(a, 9), la, pad_to(b, 7), lb)
        alone = torch.cat(
            [
                model(a[i : i + 1, : la[i]], la[i : i + 1], b[i : i + 1, : lb[i]], lb[i : i + 1])
                for i in range(2)
            ]
        )
    assert torch.allclose(base, padded, atol=1e-7) and torch.allclose(base, alone, atol=1e-6)


def test_the_representation_is_the_hidden_state_at_the_true_last_token() -> None:
    model = _model()
    a, la, _, _ = _batch()
    with torch.no_grad():
        h = model.encode(a, la)
        steps, _ = model.lstm(model.embed(a[1:, :2]))
    assert torch.allclose(h[1], steps[0, -1], atol=1e-6)


def test_authors_initialisation_small_normal_weights_and_forget_bias() -> None:
    model = _model()
    # the LSTM's parameters by name (attribute access is untyped in torch)
    weight = model.lstm.get_parameter
    bias = weight("bias_ih_l0") + weight("bias_hh_l0")
    assert (
        torch.all(bias[5:10] == 1.5)
        and bias[:5].abs().max() <= 0.5
        and bias[10:].abs().max() <= 0.5
    )
    assert abs(weight("weight_hh_l0").std().item() - 0.2 / 5**0.5) < 0.03  # H = 5
    assert abs(weight("weight_ih_l0").std().item() - 0.2 / 40**0.25) < 0.03  # H·D = 5·8
    assert not model.embed.weight.requires_grad


def test_scores_stay_on_the_one_to_five_scale() -> None:
    model = _model()
    a, la, b, lb = _batch()
    with torch.no_grad():
        s = to_score(model(a, la, b, lb))
    assert torch.all((s > 1) & (s <= 5))
