"""MLX's NCCL all_sum between N processes on this machine, one GPU each: the
time of one sum of a Qwen3-8B decode activation ([1, 1, 4096] bf16) and of a
batch-32 one, as `--tp N` issues two per layer. Usage: nccl_all_sum.py N."""
import os
import socket
import subprocess
import sys
import time


def child():
    import mlx.core as mx

    g = mx.distributed.init(strict=True, backend="nccl")
    for rows in (1, 32):
        x = mx.ones((rows, 1, 4096), dtype=mx.bfloat16)
        for _ in range(20):
            mx.eval(mx.distributed.all_sum(x, group=g))
        n = 500
        t = time.perf_counter()
        y = x
        for _ in range(n):
            y = mx.distributed.all_sum(y, group=g) * 0.5
        mx.eval(y)
        per = (time.perf_counter() - t) / n * 1e6
        if g.rank() == 0:
            print(f"| {g.size()} ranks | [{rows}, 1, 4096] bf16 | {per:.1f} us per all_sum (chained, one eval) |")


def main():
    if os.environ.get("MLX_RANK"):
        return child()
    n = int(sys.argv[1])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for r in range(n):
        env = dict(os.environ, MLX_RANK=str(r), MLX_WORLD_SIZE=str(n), NCCL_HOST_IP="127.0.0.1",
                   NCCL_PORT=str(port), CUDA_VISIBLE_DEVICES=str(r))
        procs.append(subprocess.Popen([sys.executable, __file__], env=env))
    sys.exit(max(p.wait() for p in procs))


if __name__ == "__main__":
    main()
