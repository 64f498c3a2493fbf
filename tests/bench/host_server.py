"""Starting `host serve` for a benchmark: the process, once /health answers."""
import subprocess
import time
import urllib.request


def start(cmd, port):
    """Runs `cmd` (a `host serve ... --port PORT` command line) and waits up
    to two minutes for its /health; exits the benchmark if it never comes."""
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(600):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).read()
            return p
        except Exception:
            time.sleep(0.2)
    p.kill()
    raise SystemExit(f"server did not start: {cmd}")
