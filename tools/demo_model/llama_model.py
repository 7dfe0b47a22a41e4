"""The demo model in PyTorch: a llama transformer with the exact math of mqlm's forward pass
(model/llama/reference_model.cpp, gpu/reference_ops.cpp), and its weights as GGUF stores them.

    x = embedding[token]
    per layer:  x += Wo attention(rope(Wq rmsnorm(x)), rope(Wk rmsnorm(x)), Wv rmsnorm(x))
                x += Wdown (silu(Wgate rmsnorm(x)) * Wup rmsnorm(x))
    logits = output rmsnorm(x)        (output tied to the embedding when config.tied)

rmsnorm(x) = x / sqrt(mean(x^2) + eps) * weight. RoPE is llama.cpp's "normal" layout (the one
mqlm applies to architecture llama): pairs (2i, 2i+1) of each head rotate by
position * base^(-2i / head_dim). Attention is causal, scaled by 1/sqrt(head_dim); with grouped
query attention, query head h reads key/value head h // (heads / kv_heads). No biases.

Compatible with PyTorch 1.13 and later; uses scaled_dot_product_attention where it exists
(2.0+) when training, and the plain formula otherwise and for the golden outputs.

mqlm keeps the KV cache in F16: reference_copy(kv_f16=True) computes as if keys (after RoPE) and
values were stored so, which is what mqlm's GPU forward pass should reproduce most closely.
"""
import copy
import math
from dataclasses import dataclass, asdict

import torch
import torch.nn as nn
import torch.nn.functional as F

import gguf_writer


@dataclass
class ModelConfig:
    vocab_size: int = 4096
    dim: int = 384
    layers: int = 6
    heads: int = 6
    kv_heads: int = 2
    ffn: int = 1024
    context: int = 512
    rope_base: float = 10000.0
    rms_eps: float = 1e-5
    tied: bool = True  # the output matrix is the embedding (GGUF: no output.weight)

    @property
    def head_dim(self):
        return self.dim // self.heads

    def check(self):
        assert self.dim % self.heads == 0 and self.heads % self.kv_heads == 0
        # mqlm's GPU attention kernel takes these head sizes (model/llama/gpu_model.cpp).
        assert self.head_dim in (64, 128), f"head dim {self.head_dim}: mqlm takes 64 and 128"

    def as_dict(self):
        return asdict(self)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        # In float32 at least, under bf16 autocast too.
        dtype = torch.promote_types(x.dtype, torch.float32)
        y = x.to(dtype)
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.to(dtype)).to(x.dtype)


def rope_tables(config: ModelConfig, length: int):
    """cos and sin of position * base^(-2i / head_dim), (length, head_dim / 2), computed in float64."""
    d = config.head_dim
    inverse = config.rope_base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = torch.arange(length, dtype=torch.float64)[:, None] * inverse[None, :]
    return torch.cos(angles), torch.sin(angles)


def apply_rope(x, cos, sin):
    """x: (batch, tokens, heads, head_dim); pairs (2i, 2i+1) rotate."""
    pairs = x.reshape(*x.shape[:-1], -1, 2)
    x0, x1 = pairs[..., 0], pairs[..., 1]
    cos = cos[None, :, None, :].to(x.dtype)
    sin = sin[None, :, None, :].to(x.dtype)
    return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).reshape(x.shape)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        hd = config.head_dim
        self.wq = nn.Linear(config.dim, config.heads * hd, bias=False)
        self.wk = nn.Linear(config.dim, config.kv_heads * hd, bias=False)
        self.wv = nn.Linear(config.dim, config.kv_heads * hd, bias=False)
        self.wo = nn.Linear(config.heads * hd, config.dim, bias=False)
        self.kv_f16 = False  # round keys and values to F16 as mqlm's KV cache stores them

    def forward(self, x, cos, sin, exact):
        c = self.config
        b, t, _ = x.shape
        q = apply_rope(self.wq(x).view(b, t, c.heads, c.head_dim), cos, sin)
        k = apply_rope(self.wk(x).view(b, t, c.kv_heads, c.head_dim), cos, sin)
        v = self.wv(x).view(b, t, c.kv_heads, c.head_dim)
        if self.kv_f16:  # mqlm rounds the float32 results
            k = k.float().half().to(k.dtype)
            v = v.float().half().to(v.dtype)
        group = c.heads // c.kv_heads
        q, k, v = (y.transpose(1, 2) for y in (q, k, v))  # (batch, heads, tokens, head_dim)
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        if not exact and hasattr(F, "scaled_dot_product_attention"):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(c.head_dim))
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
            scores = scores.masked_fill(~mask, float("-inf"))
            out = torch.softmax(scores.float() if scores.dtype != torch.float64 else scores, dim=-1).to(v.dtype) @ v
        return self.wo(out.transpose(1, 2).reshape(b, t, c.heads * c.head_dim))


class FeedForward(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.w_gate = nn.Linear(config.dim, config.ffn, bias=False)
        self.w_up = nn.Linear(config.dim, config.ffn, bias=False)
        self.w_down = nn.Linear(config.ffn, config.dim, bias=False)

    def forward(self, x):
        return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))


class Block(nn.Module):
    def __init__(self, config: ModelConfig, dropout: float):
        super().__init__()
        self.attn_norm = RMSNorm(config.dim, config.rms_eps)
        self.attn = Attention(config)
        self.ffn_norm = RMSNorm(config.dim, config.rms_eps)
        self.ffn = FeedForward(config)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x, cos, sin, exact):
        x = x + self.dropout(self.attn(self.attn_norm(x), cos, sin, exact))
        return x + self.dropout(self.ffn(self.ffn_norm(x)))


class Llama(nn.Module):
    def __init__(self, config: ModelConfig, dropout: float = 0.0):
        super().__init__()
        config.check()
        self.config = config
        self.embedding = nn.Embedding(config.vocab_size, config.dim)
        self.blocks = nn.ModuleList(Block(config, dropout) for _ in range(config.layers))
        self.output_norm = RMSNorm(config.dim, config.rms_eps)
        self.output = None if config.tied else nn.Linear(config.dim, config.vocab_size, bias=False)
        self.dropout = nn.Dropout(dropout)
        self.exact = False  # True: the plain attention formula, for golden outputs
        self._init_weights()

    def _init_weights(self):
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02
                if name.endswith("wo.weight") or name.endswith("w_down.weight"):
                    std = 0.02 / math.sqrt(2 * self.config.layers)  # residual branches start small
                nn.init.normal_(p, mean=0.0, std=std)

    def forward(self, ids):
        """ids: (batch, tokens) from position 0; returns logits (batch, tokens, vocab)."""
        t = ids.shape[1]
        cos, sin = rope_tables(self.config, t)
        cos, sin = cos.to(ids.device), sin.to(ids.device)
        x = self.dropout(self.embedding(ids))
        for block in self.blocks:
            x = block(x, cos, sin, self.exact)
        x = self.output_norm(x)
        weight = self.embedding.weight if self.output is None else self.output.weight
        return F.linear(x, weight)

    def parameter_count(self):
        return sum(p.numel() for p in self.parameters())

    def reference_copy(self, kv_f16=False, dtype=torch.float64):
        """A copy on the CPU for golden outputs: the plain attention formula, no dropout."""
        reference = copy.deepcopy(self).to("cpu", dtype).eval()
        reference.exact = True
        for block in reference.blocks:
            block.attn.kv_f16 = kv_f16
        return reference


# --- weights as GGUF stores them ---------------------------------------------------------------

def gguf_tensors(model: Llama):
    """(GGUF name, parameter) in mqlm's order (model/llama/llama_config.cpp: tensor_specs)."""
    yield "token_embd.weight", model.embedding.weight
    for i, block in enumerate(model.blocks):
        p = f"blk.{i}."
        yield p + "attn_norm.weight", block.attn_norm.weight
        yield p + "attn_q.weight", block.attn.wq.weight
        yield p + "attn_k.weight", block.attn.wk.weight
        yield p + "attn_v.weight", block.attn.wv.weight
        yield p + "attn_output.weight", block.attn.wo.weight
        yield p + "ffn_norm.weight", block.ffn_norm.weight
        yield p + "ffn_gate.weight", block.ffn.w_gate.weight
        yield p + "ffn_up.weight", block.ffn.w_up.weight
        yield p + "ffn_down.weight", block.ffn.w_down.weight
    yield "output_norm.weight", model.output_norm.weight
    if model.output is not None:
        yield "output.weight", model.output.weight


def _q8_0_blocks(w):
    """Q8_0 of a float32 matrix: per 32 elements of a row, scale d = max|x| / 127 stored as F16
    and x / d rounded to int8. Returns (d as float16 (blocks,), q as int8 (blocks, 32))."""
    blocks = w.reshape(-1, 32)
    d = (blocks.abs().amax(dim=1) / 127.0).to(torch.float16)
    scale = d.to(torch.float32)
    inverse = torch.where(scale > 0, 1.0 / scale, torch.zeros_like(scale))
    q = torch.round(blocks * inverse[:, None]).clamp(-127, 127).to(torch.int8)
    return d, q


def stored_values(w, tensor_type):
    """The float32 values a weight has once stored in tensor_type: what mqlm computes with."""
    w = w.detach().to("cpu", torch.float32)
    if tensor_type == gguf_writer.TENSOR_F32:
        return w.clone()
    if tensor_type == gguf_writer.TENSOR_F16:
        return w.to(torch.float16).to(torch.float32)
    d, q = _q8_0_blocks(w)
    return (d.to(torch.float32)[:, None] * q.to(torch.float32)).reshape(w.shape)


def _u16_bytes(values_u16):
    """A tensor of 16-bit values (as int32 in 0..65535) as little-endian bytes."""
    flat = values_u16.reshape(-1)
    return torch.stack((flat & 0xFF, (flat >> 8) & 0xFF), dim=1).to(torch.uint8).reshape(-1)


def _bytes_of(u8) -> bytes:
    try:
        return u8.numpy().tobytes()
    except (ImportError, RuntimeError):  # a PyTorch without numpy
        return bytes(u8.tolist())


def weight_bytes(w, tensor_type) -> bytes:
    """A weight's bytes in its GGUF layout (row-major, little-endian)."""
    w = w.detach().to("cpu", torch.float32).contiguous()
    if tensor_type == gguf_writer.TENSOR_F32:
        bits = w.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
        out = torch.stack([(bits >> s) & 0xFF for s in (0, 8, 16, 24)], dim=1).to(torch.uint8)
        return _bytes_of(out.reshape(-1))
    if tensor_type == gguf_writer.TENSOR_F16:
        bits = w.to(torch.float16).view(torch.int16).to(torch.int32) & 0xFFFF
        return _bytes_of(_u16_bytes(bits))
    d, q = _q8_0_blocks(w)
    d_bytes = _u16_bytes(d.view(torch.int16).to(torch.int32) & 0xFFFF).reshape(-1, 2)
    q_bytes = (q.to(torch.int32) & 0xFF).to(torch.uint8)
    return _bytes_of(torch.cat((d_bytes, q_bytes), dim=1).reshape(-1))


def matrix_type(name, weight_type):
    """Norms stay F32 (mqlm requires it); matrices take the file's type."""
    return gguf_writer.TENSOR_F32 if name.endswith("norm.weight") else weight_type


def round_to_stored(model: Llama, weight_type):
    """Replaces every weight by the values the GGUF will hold, so that PyTorch computes with
    exactly the weights mqlm loads."""
    with torch.no_grad():
        for name, p in gguf_tensors(model):
            p.copy_(stored_values(p, matrix_type(name, weight_type)).to(p.device, p.dtype))
