"""The entry points as a user runs them: `experiments.serve` starts with one command, answers, and
stops on Ctrl-C; option errors exit with status 2."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_serve_starts_answers_and_stops(warmup_dir):
    port = _free_port()
    cmd = [sys.executable, "-m", "experiments.serve", "--checkpoint", str(warmup_dir), "--quantization", "mxfp8",
           "--port", str(port), "--engine.prompt_buckets=32", "--engine.max_new_tokens=8", "--log_level=warning"]
    proc = subprocess.Popen(cmd, cwd=REPO, env={**os.environ, "JAX_PLATFORMS": "cpu"}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 180
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30.0) as client:
            while True:
                assert proc.poll() is None, proc.stdout.read()
                assert time.monotonic() < deadline, "the server did not come up within 180 s"
                try:
                    health = client.get("/health").json()
                    break
                except httpx.TransportError:
                    time.sleep(0.5)
            assert health["quantization"] == "mxfp8" and health["recipe"] == "mxfp8"
            name = f"{warmup_dir.name}-mxfp8"
            body = client.post("/v1/completions", json={"model": name, "prompt": "a=1. b=a+2. What is b?\n",
                                                        "max_tokens": 8, "temperature": 0}).json()
            assert len(body["choices"][0]["token_ids"]) <= 8
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, output
        assert f"serving '{name}': mxfp8 (recipe mxfp8" in output
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


@pytest.mark.parametrize("module, args, message", [
    ("experiments.serve", ["--quantization", "fp8"], "valid options: bf16, mxfp8, nvfp4_online"),
    ("experiments.serve_eval", ["--deployments", "bf16,fp8"], "quantization must be one of"),
])
def test_option_errors_exit_2(module, args, message):
    proc = subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, env={**os.environ, "JAX_PLATFORMS": "cpu"},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and message in proc.stderr
