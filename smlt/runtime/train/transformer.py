"""`transformer`: a token classifier on `torch.nn.TransformerEncoder`: token embedding plus learned
positions, `layers` encoder layers, mean pooling over the tokens, a linear head."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from smlt.runtime.errors import InvalidJob
from smlt.runtime.train.shapes import token_shape


class TokenClassifier(nn.Module):
    def __init__(
        self,
        length: int,
        vocab_size: int,
        output_dim: int,
        d_model: int,
        heads: int,
        layers: int,
        ff: int,
        dropout: float,
    ):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model)
        self.position = nn.Parameter(torch.empty(1, length, d_model))
        nn.init.normal_(self.position, std=0.02)
        layer = nn.TransformerEncoderLayer(d_model, heads, ff, dropout, batch_first=True)
        # enable_nested_tensor only speeds up padded batches, which fixed-length samples never are.
        self.encoder = nn.TransformerEncoder(layer, layers, norm=nn.LayerNorm(d_model), enable_nested_tensor=False)
        self.head = nn.Linear(d_model, output_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_floating_point():
            raise InvalidJob(
                f"model.name: transformer takes token ids (integers), got {x.dtype} input: "
                "prepare the dataset as integer token sequences"
            )
        h = self.encoder(self.embed(x) + self.position)
        return self.head(h.mean(dim=1))


def transformer(
    input_shape: Sequence[int],
    output_dim: int,
    vocab_size: int | None = None,
    d_model: int = 64,
    heads: int = 4,
    layers: int = 2,
    ff: int = 128,
    dropout: float = 0.1,
) -> nn.Module:
    length, vocab = token_shape("transformer", input_shape, vocab_size)
    if d_model % heads:
        raise InvalidJob(f"model.params: transformer's d_model ({d_model}) must be a multiple of heads ({heads})")
    return TokenClassifier(length, vocab, output_dim, d_model, heads, layers, ff, dropout)
