"""Small models for parity tests: each builds from a seed and makes its own batch."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 4)
        )

    def forward(self, x):
        return self.net(x)

    @staticmethod
    def batch(g):
        return torch.randn(16, 10, generator=g), torch.randint(0, 4, (16,), generator=g)

    def loss(self, batch):
        x, y = batch
        return F.cross_entropy(self(x), y)


class CNN(nn.Module):
    def __init__(self, dropout=0.0):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, stride=1)
        self.drop = nn.Dropout(dropout)
        self.fc = nn.Linear(16 * 3 * 3, 5)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(self.drop(x.flatten(1)))

    @staticmethod
    def batch(g):
        return torch.randn(8, 3, 16, 16, generator=g), torch.randint(0, 5, (8,), generator=g)

    def loss(self, batch):
        x, y = batch
        return F.cross_entropy(self(x), y)


class LSTMTagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(20, 12)
        self.lstm = nn.LSTM(12, 16, num_layers=1, batch_first=True)
        self.head = nn.Linear(16, 20)

    def forward(self, tokens):
        out, _ = self.lstm(self.emb(tokens))
        return self.head(out)

    @staticmethod
    def batch(g):
        tokens = torch.randint(0, 20, (4, 7), generator=g)
        return tokens, torch.roll(tokens, -1, dims=1)

    def loss(self, batch):
        x, y = batch
        return F.cross_entropy(self(x).flatten(0, 1), y.flatten())


class TinyTransformer(nn.Module):
    def __init__(self, vocab=32, dim=32, heads=4, block=8, dropout=0.0):
        super().__init__()
        self.heads = heads
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(block, dim)
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.drop = nn.Dropout(dropout)
        self.lnf = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, idx):
        b, t = idx.shape
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        q, k, v = self.qkv(self.ln1(x)).split(x.shape[-1], dim=2)
        shape = (b, t, self.heads, -1)
        q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.drop(self.proj(att.transpose(1, 2).reshape(b, t, -1)))
        x = x + self.drop(self.mlp(self.ln2(x)))
        return self.head(self.lnf(x))

    @staticmethod
    def batch(g):
        idx = torch.randint(0, 32, (4, 8), generator=g)
        return idx, torch.roll(idx, -1, dims=1)

    def loss(self, batch):
        x, y = batch
        return F.cross_entropy(self(x).flatten(0, 1), y.flatten())


MODELS = {"mlp": MLP, "cnn": CNN, "lstm": LSTMTagger, "transformer": TinyTransformer}
