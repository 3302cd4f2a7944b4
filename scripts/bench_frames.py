"""Frame codec crossover: numpy (arrays) vs struct (Python tuples) for encoding and decoding
frames of N items, from and to Python values, in one process. Prints one JSON object per size."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from shm import frames as F  # noqa: E402


def measure(count: int, number: int, runs: int) -> dict:
    rows = [(i, 1, 0) for i in range(count)]
    columns = {"request_id": list(range(count)), "status": [1] * count, "error": [0] * count}
    frame = F.encode_rows(F.Kind.COMPLETION, None, rows)

    def best(fn) -> float:
        return statistics.median(timeit.repeat(fn, number=number, repeat=runs)) / number * 1e6

    out = {
        "items": count,
        "encode_struct_us": best(lambda: F.encode_rows(F.Kind.COMPLETION, None, rows)),
        "encode_numpy_us": best(lambda: F.encode_events(F.Kind.COMPLETION, **columns)),
        "decode_struct_us": best(lambda: F.decode_rows(frame)),
        "decode_numpy_us": best(lambda: F.decode_events(frame)[1].tolist()),
    }
    out["encode_numpy_over_struct"] = out["encode_numpy_us"] / out["encode_struct_us"]
    out["decode_numpy_over_struct"] = out["decode_numpy_us"] / out["decode_struct_us"]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="1,4,16,64,128,512")
    parser.add_argument("--number", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    for size in (int(s) for s in args.sizes.split(",")):
        row = measure(size, args.number, args.runs)
        print(json.dumps(row) if args.json else " ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}"
                                                          for k, v in row.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
