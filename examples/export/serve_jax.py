"""Serve a StableHLO directory written by torch_pjrt.export.save with jax and numpy
alone (torch is not importable here): POST a JSON body {"inputs": [...]} (one nested
list per model input) to /predict, get {"outputs": [...]} back.

    python examples/export/serve_jax.py examples/export/out/classifier [--port 8000]

It prints "serving on http://HOST:PORT" once it listens (port 0: any free port).
"""

import sys

sys.modules["torch"] = None  # (importing torch now fails: this server does not need it)

import argparse  # noqa: E402
import json  # noqa: E402
import pathlib  # noqa: E402
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402


def load(path: pathlib.Path):
    """The program, its weights and the inputs' dtypes (docs/export.md's lines)."""
    jax.config.update("jax_enable_x64", True)  # (int64 inputs stay int64, as in PyTorch)
    program = jax.export.deserialize(bytearray((path / "program.jaxexport").read_bytes()))
    with np.load(path / "weights.npz") as saved:
        weights = [saved[f"w{i}"] for i in range(len(saved.files))]
    meta = json.loads((path / "meta.json").read_text())
    return program, weights, [spec["dtype"] for spec in meta["inputs"]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("program", type=pathlib.Path)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    args = ap.parse_args()
    program, weights, dtypes = load(args.program)
    call = jax.jit(program.call)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            if self.path != "/predict":
                return self.send_error(404, "POST to /predict")
            try:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                inputs = [np.asarray(x, dtype=d) for x, d in zip(body["inputs"], dtypes)]
                if len(inputs) != len(dtypes):
                    raise ValueError(f"expected {len(dtypes)} inputs, got {len(inputs)}")
                outputs = [np.asarray(y).tolist() for y in call(weights, *inputs)]
            except Exception as exc:  # noqa: BLE001  (the client's error, told to the client)
                return self.send_error(400, f"{type(exc).__name__}: {exc}")
            reply = json.dumps({"outputs": outputs}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args):  # (quiet: one line per request is noise here)
            pass

    server = ThreadingHTTPServer((args.host, args.port), Handler)
    print(f"serving on http://{args.host}:{server.server_port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
