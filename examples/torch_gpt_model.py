"""A small GPT in plain PyTorch (torch.nn layers only), its synthetic data,
and its training in eager PyTorch with torch.optim.AdamW: the reference
that examples/torch_gpt.py and tests/test_torch.py hold Plexus to.

The model is four nn.Modules in a row (GPT.stages()), so that a pipeline
can place one per stage: embedding + block, block, block, final norm +
output projection."""
import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

VOCAB, D_MODEL, HEADS, SEQ, BATCH = 32, 16, 2, 8, 8
LR, BETAS, EPS, WEIGHT_DECAY = 1e-2, (0.9, 0.99), 1e-8, 0.01


class Attention(nn.Module):
    """Causal multi-head self-attention written with plain matmuls."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(D_MODEL, 3 * D_MODEL)
        self.out = nn.Linear(D_MODEL, D_MODEL)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        q, k, v = (a.view(b, t, HEADS, d // HEADS).transpose(1, 2)
                   for a in (q, k, v))
        scores = q @ k.transpose(-2, -1) / (d // HEADS) ** 0.5
        causal = torch.ones(t, t, dtype=torch.bool).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
        y = scores.softmax(dim=-1) @ v
        return self.out(y.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(D_MODEL)
        self.attn = Attention()
        self.ln2 = nn.LayerNorm(D_MODEL)
        self.mlp = nn.Sequential(nn.Linear(D_MODEL, 4 * D_MODEL), nn.GELU(),
                                 nn.Linear(4 * D_MODEL, D_MODEL))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Embed(nn.Module):
    """Token embedding + learned positions, then the first block."""

    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, D_MODEL)
        self.pos = nn.Embedding(SEQ, D_MODEL)
        self.block = Block()

    def forward(self, tokens):
        positions = torch.arange(tokens.shape[1])
        return self.block(self.tok(tokens) + self.pos(positions))


class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(D_MODEL)
        self.proj = nn.Linear(D_MODEL, VOCAB)

    def forward(self, x):
        return self.proj(self.ln(x))


class GPT(nn.Module):
    """tokens (int64 [B, T]) -> logits (float32 [B, T, VOCAB])."""

    def __init__(self, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.embed, self.block1, self.block2 = Embed(), Block(), Block()
        self.head = Head()

    def stages(self):
        return [self.embed, self.block1, self.block2, self.head]

    def forward(self, tokens):
        for stage in self.stages():
            tokens = stage(tokens)
        return tokens


def loss_fn(logits, targets):
    """Mean next-token cross-entropy, written with a one-hot product: it
    equals F.cross_entropy, whose lowering (a gather pairing each row with
    an iota over the batch) plexus.jit's check across islands refuses when
    the batch is split over hosts."""
    logp = logits.log_softmax(dim=-1)
    picked = (F.one_hot(targets, VOCAB).to(logp.dtype) * logp).sum(dim=-1)
    return -picked.mean()


def make_optimizer(params):
    return torch.optim.AdamW(params, lr=LR, betas=BETAS, eps=EPS,
                             weight_decay=WEIGHT_DECAY)


def make_batches(steps, batch=BATCH, seed=0):
    """`steps` (inputs, targets) pairs of int64 [batch, SEQ] tensors: each
    sequence counts up modulo VOCAB from a random start with a random
    stride in {1, 2, 3}."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        start = rng.integers(0, VOCAB, size=(batch, 1))
        stride = rng.integers(1, 4, size=(batch, 1))
        seq = (start + stride * np.arange(SEQ + 1)) % VOCAB
        seq = torch.from_numpy(seq.astype(np.int64))
        out.append((seq[:, :-1], seq[:, 1:]))
    return out


def train_eager(steps, seed=0):
    """The reference: eager PyTorch, torch.optim.AdamW, in this process.
    Returns the loss of each step (before its update)."""
    model = GPT(seed)
    opt = make_optimizer(model.parameters())
    losses = []
    for x, y in make_batches(steps, seed=seed):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses
