"""The GPT of examples/gpt in PyTorch, for the peers zero is measured against
(bench/ddp_peer.py: DDP on CPU ranks; bench/gpu/torch_reference.py: plain, FSDP2 and
FSDP2 + CPU offload on a GPU): pre-LayerNorm blocks, fused qkv, attention as matmul + float32
softmax, GELU MLP x4, learned positions, head tied to the token embedding,
GPT-2 initialisation (std 0.02, residual projections 0.02 / sqrt(2 depth)).
forward(tokens) returns the logits; LossModel wraps it with the loss, as
the distributed wrappers (DDP, DeepSpeed's engine) take it.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Attention(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, x):
        B, T, C = x.shape
        H, D = self.heads, C // self.heads
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in (q, k, v))
        scores = (q * (1.0 / math.sqrt(D))) @ k.transpose(-2, -1)
        future = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
        probs = torch.softmax(scores.float(), dim=-1).to(v.dtype)
        return self.proj((probs @ v).transpose(1, 2).reshape(B, T, C))


class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.attn = Attention(width, heads)
        self.ln2 = nn.LayerNorm(width)
        self.fc = nn.Linear(width, 4 * width)
        self.out = nn.Linear(4 * width, width)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab, context, depth, width, heads):
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(depth))
        self.ln_f = nn.LayerNorm(width)
        for name, p in self.named_parameters():  # GPT-2 initialisation
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * depth) if name.endswith(("attn.proj.weight", "out.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, tokens):
        T = tokens.shape[1]
        x = self.wte(tokens) + self.wpe(torch.arange(T, device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return F.linear(self.ln_f(x), self.wte.weight)  # tied head


class LossModel(nn.Module):
    """The GPT and its mean cross-entropy (in float32) in one forward."""

    def __init__(self, gpt):
        super().__init__()
        self.gpt = gpt

    def forward(self, tokens, targets):
        logits = self.gpt(tokens)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))
