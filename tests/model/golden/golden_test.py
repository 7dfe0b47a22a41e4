#!/usr/bin/python3
"""The demo model on the GPU against the outputs its training script computed in PyTorch
(tools/demo_model/golden.json): through `mqlm generate` and through `mqlm serve`, the same greedy
continuation of every golden prompt (token ids and text) with top-5 logprobs close to PyTorch's
computed with an F16 KV cache as mqlm's (golden.json's top_f16_kv; its f16_kv_effect says how far
those are from the exact ones). Close is within --tolerance, or within 4 times golden.json's
float32_effect where that is larger: how far PyTorch's own float32 lands from its float64 with
the same weights and cache, the spread any float32 implementation may show on this model.

    golden_test.py --mqlm build/mqlm --model models/demo.gguf --golden tools/demo_model/golden.json \\
        --via generate|serve --work DIR

Exits 1 on any difference, and when the model or golden.json is missing.

`mqlm generate --json` prints one line shaped like the server's final event (which `mqlm client
--json` prints), so both are compared the same way.
"""
import argparse
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time

TOP = 5  # the top logprobs asked of the server


def sha256_of(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


class Failures:
    def __init__(self):
        self.lines = []
        self.worst = 0.0

    def add(self, line):
        self.lines.append(line)
        print("FAIL: " + line, flush=True)


def stop_cases(golden):
    """Stop strings on two golden continuations, with the text and finish each must give: one
    that ends the output inside it (what comes from the stop string on is dropped), and one that
    the output's end could begin but never completes (the text held back for it is released)."""
    cases = []
    for prompt in golden["prompts"]:
        text = prompt["continuation"]
        if prompt["tokens"] and "Oscar" in text:
            cases.append((prompt, "Oscar", text[:text.index("Oscar")], "stop"))
        if prompt["tokens"] and prompt["finish"] == "length" and text.endswith(" the"):
            cases.append((prompt, "the end of it", text, "length"))
    assert len(cases) == 2, "golden.json no longer has the continuations the stop cases are made from"
    return cases


def check_stop(case, output, failures, how):
    prompt, stop, text, finish = case
    name = f"{prompt['text']!r} with stop {stop!r} ({how})"
    try:
        final = [json.loads(line) for line in output.splitlines() if line.strip()][-1]
    except (ValueError, IndexError):
        failures.add(f"{name}: no JSON final event: {output[-2000:]!r}")
        return
    if (final.get("text"), final.get("finish_reason")) != (text, finish):
        failures.add(f"{name}: text {final.get('text')!r} finishing {final.get('finish_reason')}, "
                     f"expected {text!r} finishing {finish}")


def check_generate(args, golden, failures):
    def generate(prompt, extra):
        command = [args.mqlm, "generate", args.model, "-p", prompt["text"], "-n", str(len(prompt["tokens"])),
                   "--temperature", "0", "--json"] + extra
        run = subprocess.run(command, capture_output=True, timeout=300)
        if run.returncode != 0:
            failures.add(f"mqlm generate exited {run.returncode} for {prompt['text']!r}:\n"
                         f"{run.stderr.decode(errors='replace')[-2000:]}")
        return run.stdout.decode("utf-8", errors="replace")

    for prompt in golden["prompts"]:
        if not prompt["tokens"]:
            continue  # a near tie at the first step: nothing to compare
        output = generate(prompt, ["--logprobs", "--top-logprobs", str(TOP)])
        compare_final(prompt, output, args.tolerance, failures, "generate")
    for case in stop_cases(golden):
        check_stop(case, generate(case[0], ["--stop", case[1]]), failures, "generate")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args):
    server = f"tcp://127.0.0.1:{free_port()}"
    log = open(os.path.join(args.work, "serve.log"), "w")
    process = subprocess.Popen([args.mqlm, "serve", args.model, "--listen", server, "--insecure"], stdout=log,
                               stderr=subprocess.STDOUT)
    deadline = time.time() + 90
    while time.time() < deadline:
        status = subprocess.run([args.mqlm, "client", "--server", server, "--status", "--timeout-ms", "1000"],
                                capture_output=True)
        if status.returncode == 0:
            return process, server
        if process.poll() is not None:
            break
        time.sleep(0.5)
    process.kill()
    process.wait()
    with open(os.path.join(args.work, "serve.log")) as f:
        sys.exit(f"FAIL: mqlm serve did not answer a status request within 90 s:\n{f.read()[-3000:]}")


def client_command(args, server, prompt):
    return [args.mqlm, "client", "--server", server, "-p", prompt["text"], "-n", str(len(prompt["tokens"])),
            "--temperature", "0", "--logprobs", "--top-logprobs", str(TOP), "--no-stream", "--json",
            "--timeout-ms", "120000"]


def compare_final(prompt, output, tolerance, failures, how):
    """The final event of one request against the golden continuation."""
    name = f"{prompt['text']!r} ({how})"
    try:
        final = [json.loads(line) for line in output.splitlines() if line.strip()][-1]
    except (ValueError, IndexError):
        failures.add(f"{name}: mqlm client printed no JSON final event: {output[-2000:]!r}")
        return
    if final.get("event") != "final" or final.get("finish_reason") not in ("stop", "length"):
        failures.add(f"{name}: the request did not finish: {json.dumps(final)[:2000]}")
        return
    want = prompt["tokens"]
    if final["tokens"] != want:
        failures.add(f"{name}: tokens {final['tokens']}, PyTorch {want}")
        return
    if final["text"] != prompt["continuation"]:
        failures.add(f"{name}: text {final['text']!r}, PyTorch {prompt['continuation']!r}")
    for index, (step, got) in enumerate(zip(prompt["steps"], final["logprobs"])):
        golden_top = {token: logprob for token, logprob in step["top_f16_kv"]}
        differences = [abs(got["logprob"] - step["logprob_f16_kv"])]
        for token, logprob in got["top"]:
            if token not in golden_top:
                failures.add(f"{name} step {index}: token {token} ({logprob:.5f}) is in mqlm's top {TOP}, "
                             f"not in PyTorch's top {len(golden_top)}")
                continue
            differences.append(abs(logprob - golden_top[token]))
        # A token of PyTorch's top 5 that mqlm left out must have tied with mqlm's fifth.
        mqlm_tokens = {token for token, _ in got["top"]}
        fifth = min(logprob for _, logprob in got["top"])
        for token, logprob in step["top_f16_kv"][:TOP]:
            if token not in mqlm_tokens and logprob > fifth + tolerance:
                failures.add(f"{name} step {index}: PyTorch's top {TOP} has token {token} ({logprob:.5f}), "
                             f"mqlm's does not (its fifth: {fifth:.5f})")
        worst = max(differences)
        failures.worst = max(failures.worst, worst)
        if worst > tolerance:
            failures.add(f"{name} step {index}: logprobs differ by {worst:.2e} (tolerance {tolerance:.1e}): "
                         f"mqlm {got}, PyTorch {step['top_f16_kv'][:TOP]}")


def check_serve(args, golden, failures):
    process, server = start_server(args)
    prompts = [p for p in golden["prompts"] if p["tokens"]]
    try:
        # One request at a time, then all at once (batched decode steps must give the same).
        for prompt in prompts:
            run = subprocess.run(client_command(args, server, prompt), capture_output=True, timeout=300)
            compare_final(prompt, run.stdout.decode("utf-8", errors="replace"), args.tolerance, failures, "alone")
        for case in stop_cases(golden):
            run = subprocess.run(client_command(args, server, case[0]) + ["--stop", case[1]], capture_output=True,
                                 timeout=300)
            check_stop(case, run.stdout.decode("utf-8", errors="replace"), failures, "serve")
        clients = [subprocess.Popen(client_command(args, server, p), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                   for p in prompts]
        for prompt, client in zip(prompts, clients):
            out, _ = client.communicate(timeout=300)
            compare_final(prompt, out.decode("utf-8", errors="replace"), args.tolerance, failures, "batched")
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            failures.add("mqlm serve still ran 15 s after SIGTERM")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mqlm", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--golden", required=True)
    parser.add_argument("--via", choices=["generate", "serve"], required=True)
    parser.add_argument("--work", required=True, help="a directory for logs")
    parser.add_argument("--tolerance", type=float, default=1e-3, help="largest logprob difference allowed")
    args = parser.parse_args()
    for path in (args.model, args.golden):
        if not os.path.exists(path):
            print(f"FAIL: {path} does not exist (it is committed; tools/demo_model/train.py writes it)")
            return 1
    with open(args.golden) as f:
        golden = json.load(f)
    if sha256_of(args.model) != golden["model_sha256"]:
        print(f"FAIL: {args.golden} was computed for another model than {args.model} (sha256 differs): "
              "commit the demo.gguf and golden.json of one training run")
        return 1
    os.makedirs(args.work, exist_ok=True)
    args.tolerance = max(args.tolerance, 4 * golden["float32_effect"])
    failures = Failures()
    (check_generate if args.via == "generate" else check_serve)(args, golden, failures)
    compared = sum(len(p["tokens"]) for p in golden["prompts"])
    print(f"largest logprob difference from PyTorch with an F16 KV cache: {failures.worst:.2e} (tolerance "
          f"{args.tolerance:.1e}); PyTorch's float32 differs from its float64 by up to "
          f"{golden['float32_effect']:.2e}, the F16 KV cache moves them by up to {golden['f16_kv_effect']:.2e}")
    if failures.lines:
        print(f"{len(failures.lines)} differences from {args.golden} through mqlm {args.via}")
        return 1
    print(f"mqlm {args.via} reproduces {compared} golden tokens of {len(golden['prompts'])} prompts")
    return 0


if __name__ == "__main__":
    sys.exit(main())
