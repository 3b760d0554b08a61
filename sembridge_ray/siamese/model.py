"""The MaLSTM: one LSTM shared by both sentences, scored by 1 + 4·exp(−‖h_a − h_b‖₁) (Mueller &
Thyagarajan, 2016)."""

from __future__ import annotations

from typing import cast

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence

PAD = 0
"""Row 0 of every embedding matrix is the all-zero padding vector."""
LSTM_PARAMETERS = ("weight_hh_l0", "weight_ih_l0", "bias_hh_l0", "bias_ih_l0")


class MaLSTM(nn.Module):
    """Siamese LSTM over fixed word vectors.

    ``embeddings`` (V, D) stay frozen; the LSTM(D -> hidden) is the only trained part and is shared
    by both sides (one module, so the weights are tied by construction)."""

    def __init__(
        self,
        embeddings: torch.Tensor,
        hidden: int = 50,
        forget_bias: float = 1.5,
        init_sigma: float = 0.2,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding.from_pretrained(embeddings.float(), freeze=True, padding_idx=PAD)
        self.lstm = nn.LSTM(embeddings.shape[1], hidden, batch_first=True)
        init_lstm(self.lstm, forget_bias, init_sigma, generator)

    def encode(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """ids (B, T) long, lengths (B,) -> hidden state at each sentence's true last token (B, H).

        Packed sequences make the LSTM stop at each true length, so trailing padding never reaches
        h."""
        packed = pack_padded_sequence(
            self.embed(ids), lengths.cpu().clamp(min=1), batch_first=True, enforce_sorted=False
        )
        h_n: torch.Tensor  # (layers, B, H)
        _, (h_n, _) = self.lstm(packed)
        return h_n[-1]

    def forward(
        self, ids_a: torch.Tensor, len_a: torch.Tensor, ids_b: torch.Tensor, len_b: torch.Tensor
    ) -> torch.Tensor:
        """ids_a (B, Ta), len_a (B,), ids_b (B, Tb), len_b (B,) -> similarity in (0, 1] (B,) =
        exp(−‖h_a − h_b‖₁).

        Both sides run through the LSTM in one call (a (2B, T) batch): the same weights, half the
        kernel launches."""
        width = max(ids_a.shape[1], ids_b.shape[1])
        ids = torch.cat([pad_to(ids_a, width), pad_to(ids_b, width)])
        h = self.encode(ids, torch.cat([len_a, len_b]))
        h_a, h_b = h.split(ids_a.shape[0])
        return manhattan_similarity(h_a, h_b)


def manhattan_similarity(h_a: torch.Tensor, h_b: torch.Tensor) -> torch.Tensor:
    """h_a (B, H), h_b (B, H) -> exp(−‖h_a − h_b‖₁) (B,), in (0, 1]."""
    return torch.exp(-(h_a - h_b).abs().sum(dim=1))


def to_score(similarity: torch.Tensor) -> torch.Tensor:
    """similarity in (0, 1] (B,) -> relatedness on SICK's 1-5 scale (B,)."""
    return 1.0 + 4.0 * similarity


def to_target(score: torch.Tensor) -> torch.Tensor:
    """relatedness 1-5 (B,) -> regression target (y − 1)/4 in [0, 1] (B,)."""
    return (score - 1.0) / 4.0


def pad_to(ids: torch.Tensor, width: int) -> torch.Tensor:
    """ids (B, T) -> (B, width), right-padded with PAD."""
    return nn.functional.pad(ids, (0, width - ids.shape[1]), value=PAD)


def init_lstm(
    lstm: nn.LSTM, forget_bias: float, sigma: float, generator: torch.Generator | None
) -> None:
    """The authors' initialisation: N(0, σ²) scaled by 1/√H for the recurrent weights and by
    1/(H·D)^¼ for the input weights (σ = 0.2 gives std 0.028 and 0.017 at H = 50, D = 384); biases
    U(−0.5, 0.5) with the forget gate at 1.5.

    PyTorch orders the gates (input, forget, cell, output) and adds two biases; the biases go in
    ``bias_ih``."""
    hidden, dim = lstm.hidden_size, lstm.input_size
    w_hh, w_ih, b_hh, b_ih = (cast(torch.Tensor, getattr(lstm, n)) for n in LSTM_PARAMETERS)
    with torch.no_grad():
        w_hh.copy_(torch.randn(w_hh.shape, generator=generator) * sigma / hidden**0.5)
        w_ih.copy_(torch.randn(w_ih.shape, generator=generator) * sigma / (hidden * dim) ** 0.25)
        b_hh.zero_()
        b_ih.copy_(torch.rand(4 * hidden, generator=generator) - 0.5)
        b_ih[hidden : 2 * hidden] = forget_bias
