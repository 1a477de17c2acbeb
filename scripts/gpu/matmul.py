"""A bf16 matrix-multiply job for the GPU check: TFLOP/s over a fixed time, as JSON.

Run natively and as a gpurent reservation; the two figures are compared. It also keeps a
known amount of GPU memory allocated so that telemetry can attribute it to the reservation.
"""
import argparse
import json
import os
import time

import torch


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--n", type=int, default=8192)
    p.add_argument("--out", required=True)
    args = p.parse_args()

    dev = torch.device("cuda")
    a = torch.randn(args.n, args.n, device=dev, dtype=torch.bfloat16)
    b = torch.randn(args.n, args.n, device=dev, dtype=torch.bfloat16)
    ballast = torch.empty(4 * 1024**3, dtype=torch.uint8, device=dev)  # 4 GiB, for attribution
    for _ in range(10):
        c = a @ b
    torch.cuda.synchronize()
    iters = 0
    start = time.perf_counter()
    while time.perf_counter() - start < args.seconds:
        for _ in range(20):
            c = a @ b
        torch.cuda.synchronize()
        iters += 20
    elapsed = time.perf_counter() - start
    tflops = 2 * args.n**3 * iters / elapsed / 1e12
    result = {
        "tflops": tflops,
        "iters": iters,
        "seconds": elapsed,
        "device": torch.cuda.get_device_name(0),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "reservation_id": os.environ.get("GPURENT_RESERVATION_ID"),
        "ballast_bytes": ballast.numel(),
        "checksum": float(c[0, 0].float()),
    }
    with open(args.out, "w") as f:
        json.dump(result, f)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
