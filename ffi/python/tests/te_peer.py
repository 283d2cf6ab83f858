"""A TransferEngine in a process of its own, driven over stdin/stdout (one JSON line each way).

    python te_peer.py PROTOCOL [BUFFER_BYTES [LOCATION]]

Starts an engine (P2PHANDSHAKE on 127.0.0.1), allocates one managed buffer (with LOCATION
`cuda:0`: device memory of the driver `CRESCENT_CUDA_DRIVER` names, registered there), prints
{"name", "addr", "len"}, then answers commands until stdin closes:
  {"op": "notifies"}                     -> {"notifies": [[name, msg], ...]}  (taken)
  {"op": "read", "off": o, "len": n}     -> {"hex": "..."}  (the buffer's bytes)
  {"op": "fill", "off": o, "hex": "..."} -> {"ok": true}
"""

import json
import os
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
    location = sys.argv[3] if len(sys.argv) > 3 else ""
    device = None
    if location.startswith("cuda"):
        from cuda_driver import Driver

        device = Driver(os.environ["CRESCENT_CUDA_DRIVER"])
        addr = device.alloc(size)
        if te.register_memory(addr, size, location) != 0:
            print(json.dumps({"error": crescent.last_error()}), flush=True)
            return
    else:
        addr = te.allocate_managed_buffer(size)
    print(json.dumps({"name": te.get_segment_name(), "addr": addr, "len": size}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "notifies":
            out = {"notifies": [[n.name, n.msg] for n in te.get_notifies()]}
        elif cmd["op"] == "read" and device:
            # Device memory: read back by the driver itself, not through the engine.
            out = {"hex": device.dtoh(addr + cmd["off"], cmd["len"]).hex()}
        elif cmd["op"] == "fill" and device:
            device.htod(addr + cmd["off"], bytes.fromhex(cmd["hex"]))
            out = {"ok": True}
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
