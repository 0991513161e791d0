"""The same GPT as lockstep's (pre-LayerNorm blocks, causal multi-head attention, tanh GELU
MLP 4c wide, final LayerNorm, untied LM head with bias, Adam β=(0.9, 0.95), ε=1e-8), in
PyTorch: the peer `lockstep bench train` measures against — eager f32 on the CPU, and on CUDA each
mode a user would pick: eager or `torch.compile`, each in f32 with TF32 off, with TF32 matmuls, or
under bf16 autocast.

usage: python3 torch_gpt.py CORPUS WIDTH CONTEXT LAYERS HEADS BATCH STEPS WARMUP LR THREADS [DEVICE [MODE [PRECISION]]]
DEVICE is cpu (default) or cuda, MODE eager (default) or compile, PRECISION f32 (default: TF32
off), tf32 or bf16 (autocast).
prints one JSON object: tokens_per_s, loss (last step), threads, torch version, peak memory
(bytes: the process's peak resident set on the CPU, the peak allocated device memory on CUDA).
"""
import json
import math
import resource
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, c, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(c)
        self.qkv = nn.Linear(c, 3 * c)
        self.proj = nn.Linear(c, c)
        self.ln2 = nn.LayerNorm(c)
        self.fc = nn.Linear(c, 4 * c)
        self.fc2 = nn.Linear(4 * c, c)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        shape = (b, t, self.heads, c // self.heads)
        q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(c // self.heads)
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(y)
        return x + self.fc2(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, c, t, layers, heads):
        super().__init__()
        self.tok = nn.Embedding(256, c)
        self.pos = nn.Embedding(t, c)
        self.blocks = nn.ModuleList(Block(c, heads) for _ in range(layers))
        self.lnf = nn.LayerNorm(c)
        self.head = nn.Linear(c, 256)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.lnf(x))


def main():
    corpus, c, t, layers, heads, batch, steps, warmup, lr, threads = sys.argv[1:11]
    device = sys.argv[11] if len(sys.argv) > 11 else "cpu"
    mode = sys.argv[12] if len(sys.argv) > 12 else "eager"
    precision = sys.argv[13] if len(sys.argv) > 13 else "f32"
    if mode not in ("eager", "compile") or precision not in ("f32", "tf32", "bf16"):
        sys.exit(f"unknown mode {mode} or precision {precision}")
    c, t, layers, heads, batch, steps, warmup, threads = map(int, (c, t, layers, heads, batch, steps, warmup, threads))
    torch.set_num_threads(threads)
    if device == "cuda":
        if not torch.cuda.is_available():
            sys.exit("no CUDA device")
        tf32 = precision == "tf32"
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        torch.set_float32_matmul_precision("high" if tf32 else "highest")
    torch.manual_seed(1)
    data = torch.tensor(list(open(corpus, "rb").read()), dtype=torch.long)
    model = GPT(c, t, layers, heads).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=float(lr), betas=(0.9, 0.95), eps=1e-8)
    forward = torch.compile(model) if mode == "compile" else model
    gen = torch.Generator().manual_seed(1)

    def step():
        starts = torch.randint(0, len(data) - t - 1, (batch,), generator=gen)
        x = torch.stack([data[s:s + t] for s in starts]).to(device)
        y = torch.stack([data[s + 1:s + t + 1] for s in starts]).to(device)
        with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = F.cross_entropy(forward(x).view(-1, 256).float(), y.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.item()

    for _ in range(warmup):
        step()
    started = time.perf_counter()
    for _ in range(steps):
        loss = step()
    elapsed = time.perf_counter() - started
    if device == "cuda":
        peak = torch.cuda.max_memory_allocated()
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"tokens_per_s": steps * batch * t / elapsed, "loss": loss, "threads": threads,
                      "torch": torch.__version__, "parameters": sum(p.numel() for p in model.parameters()),
                      "peak_memory_bytes": peak}))


if __name__ == "__main__":
    main()
