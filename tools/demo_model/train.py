#!/usr/bin/env python3
"""Trains the demo model on the data prepare.py wrote, then writes the GGUF that mqlm serves, the
golden outputs mqlm is tested against, and the results.

    python3 tools/demo_model/train.py --data /tmp/demo-data --out /tmp/demo-out --minutes 6
    python3 tools/demo_model/train.py --data /tmp/demo-data --out /tmp/demo-smoke --smoke   # CPU, ~1 min

Needs PyTorch 1.13 or later and nothing else (no numpy, no regex: prepare.py tokenized
everything, the golden prompts included). On CUDA it trains under bf16 autocast.

Writes into --out:
  demo.gguf     llama architecture, byte-level BPE tokenizer (model "gpt2"), no chat template;
                matrices F16 (--type q8_0 for Q8_0), norms F32
  golden.json   per golden prompt: its ids, the greedy continuation (up to --golden-tokens tokens,
                ending early at <|endoftext|>) and at each step the top logprobs, computed in
                float64 on the CPU from exactly the weights in demo.gguf: "top" as the math says,
                "top_f16_kv" with keys and values rounded to F16 as mqlm's KV cache holds them
  results.json  the configuration, the training run and the held-out perplexity per token next to
                a uniform guess's (the vocabulary size)
"""
import argparse
import hashlib
import json
import math
import os
import sys
import time
from array import array

import torch
import torch.nn.functional as F

sys.dont_write_bytecode = True  # no __pycache__ beside the scripts in the repository
import gguf_writer
import llama_model
from byte_bpe import from_token_text

SMOKE = dict(dim=128, layers=2, heads=2, kv_heads=1, ffn=256, context=128)
# Steps whose best two logprobs are closer than this end a golden continuation before them: a
# near tie could go either way in another implementation, and everything after would differ.
TIE_MARGIN = 0.02
GOLDEN_TOP = 8  # logprobs kept per step (the test compares mqlm's top 5 against them)


def load_stream(path):
    ids = array("H")
    with open(path, "rb") as f:
        ids.frombytes(f.read())
    if sys.byteorder != "little":
        ids.byteswap()
    return torch.tensor(ids, dtype=torch.long)


def batches(stream, batch_size, length, generator):
    """Random windows of length + 1 tokens: inputs and the targets one token on."""
    while True:
        starts = torch.randint(0, len(stream) - length - 1, (batch_size,), generator=generator)
        window = torch.stack([stream[s:s + length + 1] for s in starts.tolist()])
        yield window[:, :-1], window[:, 1:]


@torch.no_grad()
def mean_nll(model, stream, length, device, autocast):
    """Mean negative log-likelihood per predicted token over a whole stream, cut into windows of
    `length` (every token but the first is predicted once, from the tokens before it in its window)."""
    model.eval()
    total, count = 0.0, 0
    for start in range(0, len(stream) - 1, length):
        window = stream[start:start + length + 1].to(device)
        with autocast():
            logits = model(window[None, :-1])
        total += F.cross_entropy(logits[0].float(), window[1:], reduction="sum").item()
        count += len(window) - 1
    model.train()
    return total / count


def learning_rate(progress, args):
    """Linear warm-up over the first --warmup of the run, then cosine down to a tenth."""
    if progress < args.warmup:
        return args.lr * progress / args.warmup
    t = min(1.0, (progress - args.warmup) / (1 - args.warmup))
    return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def train(model, data, args, device, log):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=args.lr, betas=(0.9, 0.95))
    generator = torch.Generator().manual_seed(args.seed)
    stream = batches(data["train"], args.batch_size, model.config.context, generator)
    autocast = autocast_for(device)
    step_model = model
    if args.compile:
        step_model = torch.compile(model)
    budget = args.minutes * 60.0
    tokens_per_step = args.batch_size * model.config.context
    total_steps = args.steps or math.ceil(args.epochs * len(data["train"]) / tokens_per_step)
    eval_every = args.eval_every or math.ceil(len(data["train"]) / tokens_per_step)  # default: each epoch
    log(f"train: up to {total_steps} steps of {tokens_per_step} tokens or {args.minutes} minutes, "
        f"validating every {eval_every} steps")
    started = time.time()
    best = {"valid_nll": float("inf"), "step": 0, "state": None}
    history, step = [], 0
    while True:
        elapsed = time.time() - started
        progress = max(step / total_steps, elapsed / budget)  # whichever ends the run first
        if progress >= 1.0:
            break
        lr = learning_rate(progress, args)
        for group in optimizer.param_groups:
            group["lr"] = lr
        inputs, targets = next(stream)
        inputs, targets = inputs.to(device, non_blocking=True), targets.to(device, non_blocking=True)
        with autocast():
            logits = step_model(inputs)
            loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        step += 1
        if step % eval_every == 0:
            valid = mean_nll(model, data["valid"], model.config.context, device, autocast)
            history.append({"step": step, "seconds": round(time.time() - started, 1), "lr": lr,
                            "train_loss": round(loss.item(), 4), "valid_nll": round(valid, 4)})
            log(f"step {step}: {time.time() - started:.0f} s, lr {lr:.2e}, train loss {loss.item():.3f}, "
                f"validation {valid:.3f} (perplexity {math.exp(valid):.1f})")
            if valid < best["valid_nll"]:
                best = {"valid_nll": valid, "step": step,
                        "state": {k: v.detach().clone() for k, v in model.state_dict().items()}}
    valid = mean_nll(model, data["valid"], model.config.context, device, autocast)
    if valid < best["valid_nll"]:
        best = {"valid_nll": valid, "step": step, "state": model.state_dict()}
    log(f"trained {step} steps in {time.time() - started:.0f} s; keeping step {best['step']} "
        f"(validation {best['valid_nll']:.3f})")
    model.load_state_dict(best["state"])
    tokens_seen = step * tokens_per_step
    return {"steps": step, "seconds": round(time.time() - started, 1), "tokens_seen": tokens_seen,
            "epochs": round(tokens_seen / len(data["train"]), 2), "kept_step": best["step"],
            "kept_epoch": round(best["step"] * tokens_per_step / len(data["train"]), 2), "history": history}


def autocast_for(device):
    if device.type == "cuda":
        return lambda: torch.autocast(device_type="cuda", dtype=torch.bfloat16)
    return lambda: torch.autocast(device_type="cpu", enabled=False)


# --- outputs -------------------------------------------------------------------------------------

def write_gguf(path, model, tokenizer, weight_type, name):
    c = model.config
    w = gguf_writer.GgufWriter()
    S, U32, F32, BOOL, I32 = gguf_writer.STRING, gguf_writer.U32, gguf_writer.F32, gguf_writer.BOOL, gguf_writer.I32
    w.set("general.architecture", S, "llama")
    w.set("general.name", S, name)
    w.set("general.description", S, "trained by tools/demo_model/train.py on Debian's fortune cookie files")
    w.set("general.license", S, "BSD (the fortune-mod data it was trained on; see tools/demo_model/README.md)")
    w.set("general.file_type", U32, 1 if weight_type == gguf_writer.TENSOR_F16 else 7)  # llama.cpp's MOSTLY_F16 / Q8_0
    if weight_type == gguf_writer.TENSOR_Q8_0:
        w.set("general.quantization_version", U32, 2)
    w.set("llama.vocab_size", U32, c.vocab_size)
    w.set("llama.context_length", U32, c.context)
    w.set("llama.embedding_length", U32, c.dim)
    w.set("llama.block_count", U32, c.layers)
    w.set("llama.feed_forward_length", U32, c.ffn)
    w.set("llama.attention.head_count", U32, c.heads)
    w.set("llama.attention.head_count_kv", U32, c.kv_heads)
    w.set("llama.rope.dimension_count", U32, c.head_dim)
    w.set("llama.rope.freq_base", F32, c.rope_base)
    w.set("llama.attention.layer_norm_rms_epsilon", F32, c.rms_eps)
    w.set("tokenizer.ggml.model", S, tokenizer["model"])
    w.set("tokenizer.ggml.pre", S, tokenizer["pre"])
    w.set_array("tokenizer.ggml.tokens", S, tokenizer["tokens"])
    w.set_array("tokenizer.ggml.token_type", I32, tokenizer["token_types"])
    w.set_array("tokenizer.ggml.merges", S, tokenizer["merges"])
    w.set("tokenizer.ggml.bos_token_id", U32, tokenizer["bos"])
    w.set("tokenizer.ggml.eos_token_id", U32, tokenizer["eos"])
    w.set("tokenizer.ggml.add_bos_token", BOOL, tokenizer["add_bos"])
    w.set("tokenizer.ggml.add_eos_token", BOOL, tokenizer["add_eos"])
    for tensor_name, p in llama_model.gguf_tensors(model):
        t = llama_model.matrix_type(tensor_name, weight_type)
        w.add_tensor(tensor_name, t, list(reversed(p.shape)), llama_model.weight_bytes(p, t))
    w.write(path)


def decode(tokenizer, ids):
    special = {i for i, t in enumerate(tokenizer["token_types"]) if t != 1}
    data = b"".join(from_token_text(tokenizer["tokens"][i]) for i in ids if i not in special)
    return data.decode("utf-8", errors="replace")


def top_logprobs(model, ids):
    """The GOLDEN_TOP best (token, logprob) after ids, best first, ties to the lower id."""
    logprobs = torch.log_softmax(model(torch.tensor([ids]))[0, -1].double(), dim=-1)
    top = torch.topk(logprobs, GOLDEN_TOP + 4)
    pairs = sorted(zip(top.indices.tolist(), top.values.tolist()), key=lambda p: (-p[1], p[0]))
    return [list(p) for p in pairs[:GOLDEN_TOP]]


def largest_difference(top, other):
    other = dict(map(tuple, other))
    return max([0.0] + [abs(v - other[t]) for t, v in top if t in other])


@torch.no_grad()
def golden_outputs(model, prompts, tokenizer, max_tokens):
    """Greedy continuations with the top logprobs of every step, in float64 on the CPU, as the
    math says and with mqlm's F16 KV cache. A continuation ends before a step where the two
    disagree on the token or its best two are within TIE_MARGIN.

    Also measures how far two honest implementations may differ: float32 against float64, both
    with the F16 KV cache (a key or value that float32 puts on the other side of an F16
    rounding boundary moves everything after it)."""
    exact, f16_kv = model.reference_copy(kv_f16=False), model.reference_copy(kv_f16=True)
    f32_f16_kv = model.reference_copy(kv_f16=True, dtype=torch.float32)
    eos = tokenizer["eos"]
    out, kv_effect, float32_effect = [], 0.0, 0.0
    for prompt in prompts["golden"]:
        ids = list(prompt["ids"])
        steps, finish, cut = [], "length", None
        while len(steps) < max_tokens:
            top, top_kv = top_logprobs(exact, ids), top_logprobs(f16_kv, ids)
            margin = min(top[0][1] - top[1][1], top_kv[0][1] - top_kv[1][1])
            if margin < TIE_MARGIN or top[0][0] != top_kv[0][0]:
                cut = {"step": len(steps), "margin": margin, "between": [top[0][0], top[1][0]]}
                break
            kv_effect = max(kv_effect, largest_difference(top, top_kv))
            float32_effect = max(float32_effect, largest_difference(top_kv, top_logprobs(f32_f16_kv, ids)))
            token = top[0][0]
            steps.append({"token": token, "logprob": top[0][1], "margin": margin, "top": top,
                          "logprob_f16_kv": top_kv[0][1], "top_f16_kv": top_kv})
            ids.append(token)
            if token == eos:
                finish = "stop"
                break
        tokens = [s["token"] for s in steps]
        out.append({"text": prompt["text"], "ids": prompt["ids"], "tokens": tokens,
                    "continuation": decode(tokenizer, tokens), "finish": finish, "near_tie_cut": cut,
                    "steps": steps})
    return out, kv_effect, float32_effect


def sha256_of(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="what prepare.py wrote")
    parser.add_argument("--out", required=True, help="directory for demo.gguf, golden.json, results.json")
    parser.add_argument("--smoke", action="store_true", help="a tiny model for a minute on the CPU")
    parser.add_argument("--minutes", type=float, default=6.0, help="training time budget: the run ends by then")
    parser.add_argument("--epochs", type=float, default=60, help="passes over the training tokens, at most")
    parser.add_argument("--steps", type=int, default=0, help="train this many steps instead of --epochs")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--warmup", type=float, default=0.03, help="fraction of the run")
    parser.add_argument("--weight-decay", type=float, default=0.1)
    parser.add_argument("--dropout", type=float, default=0.2)
    parser.add_argument("--eval-every", type=int, default=0, help="steps between validations (0: each epoch)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--type", choices=["f16", "q8_0"], default="f16", help="the GGUF's matrix type")
    parser.add_argument("--golden-tokens", type=int, default=24)
    parser.add_argument("--compile", action="store_true", help="torch.compile the training step (PyTorch 2)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    for field in ["dim", "layers", "heads", "kv_heads", "ffn", "context"]:
        parser.add_argument("--" + field.replace("_", "-"), type=int)
    args = parser.parse_args()

    os.makedirs(args.out, exist_ok=True)
    log_file = open(os.path.join(args.out, "train.log"), "a")

    def log(line):
        print(line, flush=True)
        log_file.write(line + "\n")
        log_file.flush()

    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    with open(os.path.join(args.data, "tokenizer.json")) as f:
        tokenizer = json.load(f)
    with open(os.path.join(args.data, "prompts.json")) as f:
        prompts = json.load(f)
    with open(os.path.join(args.data, "corpus.json")) as f:
        corpus = json.load(f)
    data = {name: load_stream(os.path.join(args.data, f"{name}.bin")) for name in ["train", "valid", "heldout"]}

    shape = dict(SMOKE) if args.smoke else {}
    for field in ["dim", "layers", "heads", "kv_heads", "ffn", "context"]:
        if getattr(args, field) is not None:
            shape[field] = getattr(args, field)
    if args.smoke:
        args.minutes = min(args.minutes, 1.0)
        args.batch_size = min(args.batch_size, 16)
        args.eval_every = args.eval_every or 50
    config = llama_model.ModelConfig(vocab_size=len(tokenizer["tokens"]), **shape)
    model = llama_model.Llama(config, dropout=args.dropout).to(device)
    log(f"train: {model.parameter_count() / 1e6:.2f} M parameters {config.as_dict()} on {device} "
        f"(PyTorch {torch.__version__}); {len(data['train'])} training tokens")
    run = train(model, data, args, device, log)

    weight_type = gguf_writer.TENSOR_F16 if args.type == "f16" else gguf_writer.TENSOR_Q8_0
    llama_model.round_to_stored(model, weight_type)
    autocast = autocast_for(device)
    heldout_nll = mean_nll(model, data["heldout"], config.context, device, autocast)
    valid_nll = mean_nll(model, data["valid"], config.context, device, autocast)
    gguf_path = os.path.join(args.out, "demo.gguf")
    write_gguf(gguf_path, model, tokenizer, weight_type, "mqlm demo (fortunes)" + (" smoke" if args.smoke else ""))
    continuations, kv_effect, float32_effect = golden_outputs(model, prompts, tokenizer, args.golden_tokens)
    golden = {
        "about": "greedy continuations of demo.gguf computed by tools/demo_model/train.py in float64 on the CPU "
                 "from the weights as stored in the GGUF; top: as the math says; top_f16_kv: with keys and values "
                 "rounded to F16 as mqlm's KV cache holds them; f16_kv_effect: the largest difference between "
                 "the two; float32_effect: the largest difference between top_f16_kv and the same computed "
                 "in float32; tests/model/golden checks mqlm against them",
        "model_sha256": sha256_of(gguf_path),
        "max_tokens": args.golden_tokens,
        "tie_margin": TIE_MARGIN,
        "bos": tokenizer["bos"],
        "eos": tokenizer["eos"],
        "prompts": continuations,
        "f16_kv_effect": kv_effect,
        "float32_effect": float32_effect,
        "tokenizer_cases": prompts["tokenizer_cases"],
    }
    with open(os.path.join(args.out, "golden.json"), "w") as f:
        json.dump(golden, f, ensure_ascii=False, indent=1)
    heldout_tokens = len(data["heldout"]) - 1
    results = {
        "config": config.as_dict(),
        "parameters": model.parameter_count(),
        "weight_type": args.type,
        "gguf_bytes": os.path.getsize(gguf_path),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "pytorch": torch.__version__,
        "arguments": {k: v for k, v in vars(args).items() if k not in ("data", "out") and v is not None},
        "corpus": corpus,
        "training": run,
        "validation_perplexity": math.exp(valid_nll),
        "heldout_tokens": heldout_tokens,
        "heldout_nll_per_token": heldout_nll,
        "heldout_perplexity": math.exp(heldout_nll),
        "uniform_perplexity": config.vocab_size,
        "heldout_bits_per_byte": heldout_nll * heldout_tokens / corpus["heldout_bytes"] / math.log(2),
    }
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    log(f"held-out perplexity {results['heldout_perplexity']:.2f} per token (uniform guess: {config.vocab_size}), "
        f"{results['heldout_bits_per_byte']:.3f} bits per byte; wrote {gguf_path} "
        f"({results['gguf_bytes'] / 1e6:.1f} MB), golden.json (the F16 KV cache moves logprobs by up to "
        f"{kv_effect:.1e}, float32 instead of float64 by {float32_effect:.1e}), results.json")
    for p in golden["prompts"]:
        log(f"  {p['text']!r} -> {p['continuation']!r}" + (f" (cut at a near tie: {p['near_tie_cut']})"
                                                          if p["near_tie_cut"] else ""))


if __name__ == "__main__":
    main()
