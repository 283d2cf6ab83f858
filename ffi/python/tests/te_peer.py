"""A TransferEngine in a process of its own, driven over stdin/stdout (one JSON line each way).

    python te_peer.py PROTOCOL [BUFFER_BYTES]

Starts an engine (P2PHANDSHAKE on 127.0.0.1), allocates one managed buffer, prints
{"name", "addr", "len"}, then answers commands until stdin closes:
  {"op": "notifies"}                     -> {"notifies": [[name, msg], ...]}  (taken)
  {"op": "read", "off": o, "len": n}     -> {"hex": "..."}  (the buffer's bytes)
  {"op": "fill", "off": o, "hex": "..."} -> {"ok": true}
"""

import json
import sys

from crescent.engine import TransferEngine

import crescent


def main() -> None:
    protocol = sys.argv[1]
    size = int(sys.argv[2]) if len(sys.argv) > 2 else 64 << 20
    te = TransferEngine()
    if te.initialize("127.0.0.1", "P2PHANDSHAKE", protocol, "") != 0:
        print(json.dumps({"error": crescent.last_error()}), flush=True)
        return
    addr = te.allocate_managed_buffer(size)
    print(json.dumps({"name": te.get_segment_name(), "addr": addr, "len": size}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "notifies":
            out = {"notifies": [[n.name, n.msg] for n in te.get_notifies()]}
        elif cmd["op"] == "read":
            out = {"hex": te.read_bytes_from_buffer(addr + cmd["off"], cmd["len"]).hex()}
        elif cmd["op"] == "fill":
            data = bytes.fromhex(cmd["hex"])
            out = {"ok": te.write_bytes_to_buffer(addr + cmd["off"], data, len(data)) == 0}
        else:
            out = {"error": f"unknown op {cmd['op']}"}
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
