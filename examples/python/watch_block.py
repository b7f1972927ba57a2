"""A small transformer block whose fused ops are Triton kernels with hand-written backwards, as
kernel libraries ship them, trained for a few steps under `tilegrad.watch`:

- RMSNorm: `fused_rms_norm.RMSNormFunction`;
- RoPE: rotary embeddings of the queries and keys (`RoPEFunction`: the backward rotates back);
- SwiGLU: `silu(gate) * up` (`SwiGLUFunction`), and `SwiGLUForgetsSigmoidTerm`, whose backward
  drops a term of silu's derivative: the broken kernel `watch` must catch;
- cross entropy of the logits against the next tokens (`CrossEntropyFunction`: the forward keeps
  each row's logsumexp, the backward computes softmax minus one-hot).

    python examples/python/watch_block.py          # three steps on CPU tensors, then the summary

`test_watch_block.py` runs it with the correct and the broken SwiGLU.
"""

from __future__ import annotations

import sys

import torch
import triton
import triton.language as tl

import tilegrad
from fused_rms_norm import RMSNormFunction

# -- RoPE --------------------------------------------------------------------------------------


@triton.jit
def rope_kernel(OUT, X, COS, SIN, n_pos, half, SIGN: tl.constexpr, BLOCK: tl.constexpr):
    """One row (batch, head, position) of X, rotated in pairs (i, i + half) by the position's
    angles (by minus them where SIGN is -1)."""
    row = tl.program_id(0)
    pos = row % n_pos
    i = tl.arange(0, BLOCK)
    mask = i < half
    lo = tl.load(X + row * 2 * half + i, mask=mask, other=0.0)
    hi = tl.load(X + row * 2 * half + half + i, mask=mask, other=0.0)
    c = tl.load(COS + pos * half + i, mask=mask, other=1.0)
    s = tl.load(SIN + pos * half + i, mask=mask, other=0.0) * SIGN
    tl.store(OUT + row * 2 * half + i, lo * c - hi * s, mask=mask)
    tl.store(OUT + row * 2 * half + half + i, hi * c + lo * s, mask=mask)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, sign: int) -> torch.Tensor:
    x = x.contiguous()
    out = torch.empty_like(x)
    n_pos, half = cos.shape
    rows = x.numel() // (2 * half)
    rope_kernel[(rows,)](out, x, cos, sin, n_pos, half, SIGN=sign, BLOCK=triton.next_power_of_2(half))
    return out


class RoPEFunction(torch.autograd.Function):
    """`RoPEFunction.apply(x, cos, sin)`: x of shape (..., positions, 2 * half) rotated; the
    tables, of shape (positions, half), get no gradient."""

    @staticmethod
    def forward(ctx, x, cos, sin):
        ctx.save_for_backward(cos, sin)
        return _rope(x, cos, sin, 1)

    @staticmethod
    def backward(ctx, dout):
        cos, sin = ctx.saved_tensors
        return _rope(dout, cos, sin, -1), None, None


def rope_tables(positions: int, dim: int, base: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    inv = base ** (-torch.arange(0, dim // 2, dtype=torch.float32) * 2 / dim)
    angles = torch.arange(positions, dtype=torch.float32)[:, None] * inv[None, :]
    return angles.cos().contiguous(), angles.sin().contiguous()


# -- SwiGLU ------------------------------------------------------------------------------------


@triton.jit
def swiglu_fwd_kernel(OUT, GATE, UP, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    g = tl.load(GATE + offs, mask=mask, other=0.0)
    u = tl.load(UP + offs, mask=mask, other=0.0)
    tl.store(OUT + offs, g * tl.sigmoid(g) * u, mask=mask)


@triton.jit
def swiglu_bwd_kernel(DGATE, DUP, DOUT, GATE, UP, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    d = tl.load(DOUT + offs, mask=mask, other=0.0)
    g = tl.load(GATE + offs, mask=mask, other=0.0)
    u = tl.load(UP + offs, mask=mask, other=0.0)
    sig = tl.sigmoid(g)
    tl.store(DGATE + offs, d * u * sig * (1.0 + g * (1.0 - sig)), mask=mask)
    tl.store(DUP + offs, d * g * sig, mask=mask)


@triton.jit
def swiglu_bwd_kernel_no_sigmoid_term(DGATE, DUP, DOUT, GATE, UP, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    d = tl.load(DOUT + offs, mask=mask, other=0.0)
    g = tl.load(GATE + offs, mask=mask, other=0.0)
    u = tl.load(UP + offs, mask=mask, other=0.0)
    sig = tl.sigmoid(g)
    tl.store(DGATE + offs, d * u * sig, mask=mask)  # silu'(g) is sig * (1 + g * (1 - sig))
    tl.store(DUP + offs, d * g * sig, mask=mask)


class SwiGLUFunction(torch.autograd.Function):
    """`SwiGLUFunction.apply(gate, up)`: silu(gate) * up, elementwise."""

    bwd_kernel = swiglu_bwd_kernel

    @staticmethod
    def forward(ctx, gate, up):
        gate, up = gate.contiguous(), up.contiguous()
        out = torch.empty_like(gate)
        n = out.numel()
        swiglu_fwd_kernel[(triton.cdiv(n, 256),)](out, gate, up, n, BLOCK=256)
        ctx.save_for_backward(gate, up)
        return out

    @staticmethod
    def backward(ctx, dout):
        gate, up = ctx.saved_tensors
        dout = dout.contiguous()
        dgate, dup = torch.empty_like(gate), torch.empty_like(up)
        n = gate.numel()
        type(ctx)._forward_cls.bwd_kernel[(triton.cdiv(n, 256),)](dgate, dup, dout, gate, up, n, BLOCK=256)
        return dgate, dup


class SwiGLUForgetsSigmoidTerm(SwiGLUFunction):
    """The broken variant: `dgate` is `dout * up * sigmoid(gate)`, short of a term."""

    bwd_kernel = swiglu_bwd_kernel_no_sigmoid_term


# -- cross entropy -----------------------------------------------------------------------------


@triton.jit
def cross_entropy_fwd_kernel(LOSS, LSE, LOGITS, TARGET, stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(LOGITS + row * stride + cols, mask=mask, other=-float("inf"))
    t = tl.load(TARGET + row)
    m = tl.max(x, axis=0)
    lse = m + tl.log(tl.sum(tl.exp(x - m), axis=0))
    x_t = tl.sum(tl.where(cols == t, x, 0.0), axis=0)
    tl.store(LSE + row, lse)
    tl.store(LOSS + row, lse - x_t)


@triton.jit
def cross_entropy_bwd_kernel(DLOGITS, DLOSS, LOGITS, LSE, TARGET, stride, n_cols, scale, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(LOGITS + row * stride + cols, mask=mask, other=0.0)
    t = tl.load(TARGET + row)
    p = tl.exp(x - tl.load(LSE + row))
    d = tl.load(DLOSS) * scale
    tl.store(DLOGITS + row * stride + cols, (p - tl.where(cols == t, 1.0, 0.0)) * d, mask=mask)


class CrossEntropyFunction(torch.autograd.Function):
    """`CrossEntropyFunction.apply(logits, target)`: the mean over rows of the cross entropy of
    `logits` (rows, classes) against the class indices `target` (rows,)."""

    @staticmethod
    def forward(ctx, logits, target):
        logits = logits.contiguous()
        rows, cols = logits.shape
        loss = torch.empty(rows, dtype=torch.float32, device=logits.device)
        lse = torch.empty(rows, dtype=torch.float32, device=logits.device)
        block = triton.next_power_of_2(cols)
        cross_entropy_fwd_kernel[(rows,)](loss, lse, logits, target, logits.stride(0), cols, BLOCK=block)
        ctx.save_for_backward(logits, lse, target)
        return loss.mean()

    @staticmethod
    def backward(ctx, dloss):
        logits, lse, target = ctx.saved_tensors
        rows, cols = logits.shape
        dlogits = torch.empty_like(logits)
        block = triton.next_power_of_2(cols)
        cross_entropy_bwd_kernel[(rows,)](dlogits, dloss, logits, lse, target, logits.stride(0), cols, 1.0 / rows, BLOCK=block)
        return dlogits, None


# -- the model ---------------------------------------------------------------------------------


class Block(torch.nn.Module):
    """Embedding, one pre-norm transformer block (attention with RoPE, a SwiGLU MLP), a final
    norm and the output projection; `forward(tokens)` returns the next-token loss."""

    def __init__(self, vocab: int = 48, dim: int = 32, heads: int = 2, hidden: int = 64, positions: int = 8, swiglu: type = SwiGLUFunction):
        super().__init__()
        self.heads, self.swiglu = heads, swiglu
        self.embed = torch.nn.Embedding(vocab, dim)
        self.norm1, self.norm2, self.norm_out = (torch.nn.Parameter(torch.ones(dim)) for _ in range(3))
        self.qkv = torch.nn.Linear(dim, 3 * dim, bias=False)
        self.proj = torch.nn.Linear(dim, dim, bias=False)
        self.gate_up = torch.nn.Linear(dim, 2 * hidden, bias=False)
        self.down = torch.nn.Linear(hidden, dim, bias=False)
        self.head = torch.nn.Linear(dim, vocab, bias=False)
        cos, sin = rope_tables(positions, dim // heads)
        self.register_buffer("cos", cos)
        self.register_buffer("sin", sin)

    def attention(self, h: torch.Tensor) -> torch.Tensor:
        b, t, d = h.shape
        q, k, v = self.qkv(h).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        q = RoPEFunction.apply(q, self.cos[:t], self.sin[:t])
        k = RoPEFunction.apply(k, self.cos[:t], self.sin[:t])
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(a.transpose(1, 2).reshape(b, t, d))

    def mlp(self, h: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(h).chunk(2, dim=-1)
        return self.down(self.swiglu.apply(gate, up))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens[:, :-1])
        x = x + self.attention(RMSNormFunction.apply(x, self.norm1, 1e-6))
        x = x + self.mlp(RMSNormFunction.apply(x, self.norm2, 1e-6))
        logits = self.head(RMSNormFunction.apply(x, self.norm_out, 1e-6))
        return CrossEntropyFunction.apply(logits.flatten(0, 1), tokens[:, 1:].flatten())


def batches(steps: int, batch: int = 2, positions: int = 8, vocab: int = 48) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, vocab, (batch, positions + 1), generator=g) for _ in range(steps)]


def train(model: Block, steps: int = 3) -> list[float]:
    """A few steps of AdamW; the losses. On CPU tensors the kernels run on tilegrad's engine."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    with tilegrad.intercept():
        for tokens in batches(steps):
            loss = model(tokens)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    return losses


if __name__ == "__main__":
    torch.manual_seed(0)
    model = Block(swiglu=SwiGLUForgetsSigmoidTerm if "--broken" in sys.argv else SwiGLUFunction)
    with tilegrad.watch(model):
        print("losses:", train(model))
