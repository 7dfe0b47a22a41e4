#!/usr/bin/python3
"""A client of `mqlm serve` in Python, following docs/protocol.md: a DEALER socket, one msgpack
map per frame. Streams one generate request, prints the text as it comes, then the usage.
Exits 1 on an error event or a final that is not stop or length, or when nothing comes for
--timeout seconds.

Needs pyzmq and msgpack (Debian: python3-zmq python3-msgpack); run it with /usr/bin/python3.

    /usr/bin/python3 examples/python_client.py --prompt "Once upon a time" --max-tokens 32
"""
import argparse
import sys

import msgpack
import zmq


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", default="tcp://127.0.0.1:5555", help="the server's address")
    parser.add_argument("--prompt", default="Once upon a time", help="the prompt, as text")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens to generate")
    parser.add_argument("--temperature", type=float, default=1.0, help="0 is greedy")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds without an event that end the wait")
    args = parser.parse_args()

    context = zmq.Context()
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 1000)
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
