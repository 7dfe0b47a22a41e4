#!/usr/bin/python3
"""A client of `mqlm serve` in Python, following docs/protocol.md: a DEALER socket, one msgpack
map per frame. Streams one generate request, prints the text as it comes, then the usage.
Exits 1 on an error event or a final that is not stop or length, or when nothing comes for
--timeout seconds.

Needs pyzmq and msgpack (Debian: python3-zmq python3-msgpack); run it with /usr/bin/python3.
A server that serves CURVE (`mqlm serve --curve-key`) wants its public key and this client's key
pair, files from `mqlm keygen` (docs/protocol.md, "Security: CURVE over tcp://").

    /usr/bin/python3 examples/python_client.py --prompt "Once upon a time" --max-tokens 32 \
        --curve-server-key server.pub --curve-key alice.key
"""
import argparse
import os
import sys

import msgpack
import zmq


def key_file_lines(path):
    """The words of each line of a key file that is not blank or a # comment (no Z85 key starts with #)."""
    with open(path) as f:
        return [line.split() for line in f if line.strip() and not line.lstrip().startswith("#")]


def use_curve(socket, server_key_file, key_file):
    """Makes socket a CURVE client: the server's NAME.pub (one key), this client's NAME.key
    ("public-key KEY" and "secret-key KEY" lines), all Z85 text."""
    socket.curve_serverkey = key_file_lines(server_key_file)[0][0].encode()
    keys = dict(key_file_lines(key_file))
    socket.curve_publickey = keys["public-key"].encode()
    socket.curve_secretkey = keys["secret-key"].encode()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", default="tcp://127.0.0.1:5555", help="the server's address")
    parser.add_argument("--prompt", default="Once upon a time", help="the prompt, as text")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens to generate")
    parser.add_argument("--temperature", type=float, default=1.0, help="0 is greedy")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds without an event that end the wait")
    parser.add_argument("--curve-server-key", default=os.environ.get("MQLM_CURVE_SERVER_KEY"),
                        help="the server's CURVE public key file, NAME.pub (or MQLM_CURVE_SERVER_KEY)")
    parser.add_argument("--curve-key", default=os.environ.get("MQLM_CURVE_KEY"),
                        help="this client's CURVE key pair file, NAME.key (or MQLM_CURVE_KEY)")
    args = parser.parse_args()
    if bool(args.curve_server_key) != bool(args.curve_key):
        parser.error("--curve-server-key and --curve-key go together")

    context = zmq.Context()
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 1000)
    if args.curve_key:
        use_curve(socket, args.curve_server_key, args.curve_key)
    socket.connect(args.server)
    request_id = 1
    socket.send(msgpack.packb({
        "op": "generate",
        "id": request_id,
        "prompt": args.prompt,
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "stream": True,
    }))

    poller = zmq.Poller()
    poller.register(socket, zmq.POLLIN)
    while True:
        if not poller.poll(args.timeout * 1000):
            socket.send(msgpack.packb({"op": "abort", "id": request_id}))
            print(f"\nno event from {args.server} for {args.timeout} s: is `mqlm serve --listen {args.server}` running?",
                  file=sys.stderr)
            return 1
        frame = socket.recv()
        if not frame:
            continue  # a keepalive
        event = msgpack.unpackb(frame, raw=False)
        kind = event.get("event")
        if kind == "error":
            print(f"\nerror: {event.get('code')}: {event.get('message')}", file=sys.stderr)
            return 1
        if event.get("id") != request_id:
            continue
        sys.stdout.write(event.get("text", ""))
        sys.stdout.flush()
        if kind != "final":
            continue
        print()
        usage = event.get("usage", {})
        reason = event.get("finish_reason")
        print(f"finish: {reason}, prompt tokens {usage.get('prompt_tokens')}, "
              f"completion tokens {usage.get('completion_tokens')}, cached {usage.get('cached_tokens')}",
              file=sys.stderr)
        if reason in ("stop", "length"):
            return 0
        error = event.get("error", {})
        print(f"the request ended with {reason}: {error.get('code')}: {error.get('message')}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
