"""`retake deploy` on the tiny demo: a real PostgreSQL (Debian's, started by the deployment) and a
real HAProxy in front of two `retake serve` replicas. Two directors work through the balancer,
one on each replica; the first one's replica is killed with SIGKILL mid-take; that director
reconnects through the balancer, lands on the other replica and finds its scene, its kept take
and the interrupted take as heard; the second director never noticed. The supervisor starts the
killed replica again, and SIGTERM stops the whole deployment."""

from __future__ import annotations

import asyncio
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from live_server import RETAKE, fetch, run
from websockets.exceptions import ConnectionClosed, InvalidStatus

from backend.cli import main
from backend.store import STOPPED_DURING_TAKE
from backend.tools.client import AudioFrame, Director
from backend.tools.postgres import binaries


def free_ports(count: int) -> int:
    """The first of `count` consecutive free loopback ports."""
    for _ in range(100):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            first = int(probe.getsockname()[1])
        if first + count >= 65536:
            continue
        try:
            for port in range(first, first + count):
                with socket.socket() as other:
                    other.bind(("127.0.0.1", port))
            return first
        except OSError:
            continue
    raise RuntimeError("no free ports")


def health(port: int) -> dict[str, object]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=30) as reply:
        return dict(json.loads(reply.read()))


def replica_of(director: Director) -> str:
    """The replica HAProxy sent the socket to (deploy/haproxy.cfg adds X-Retake-Replica)."""
    assert director.socket.response is not None
    return str(director.socket.response.headers["X-Retake-Replica"])


async def reconnect(url: str) -> Director:
    """Connect as a client does after losing its socket: try again (after a pause) while the
    balancer answers 502/503 (it may not have noticed the dead replica yet)."""
    for attempt in range(20):
        try:
            return await Director.connect(url)
        except InvalidStatus:
            if attempt == 19:
                raise
            await asyncio.sleep(0.5)
    raise AssertionError("unreachable")


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("haproxy") is None or binaries() is None,
                    reason="needs Debian's haproxy and postgresql (scripts/test installs them when run as root)")
def test_a_replica_killed_mid_take_leaves_its_director_on_the_other(tiny_checkpoint: Path, tmp_path: Path) -> None:
    port = free_ports(3)
    url = f"ws://127.0.0.1:{port}/ws"
    state = Path(f"/tmp/retake-deploy-{os.getpid()}")  # the postgres user cannot enter pytest's folders
    log = tmp_path / "deploy.log"
    with log.open("w") as output:
        deployment = subprocess.Popen(
            [*RETAKE, "deploy", "--replicas", "2", "--port", str(port), "--state-dir", str(state), "--",
             "--checkpoint", str(tiny_checkpoint), "--device", "cpu", "--silence-retries", "0"],
            stdout=output, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        deadline = time.monotonic() + 300
        while "deployment ready" not in log.read_text():
            assert deployment.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.25)
        replica_ports = {"replica0": port + 1, "replica1": port + 2}

        async def main() -> None:
            first = await Director.connect(url)
            second = await Director.connect(url)  # leastconn: the other replica
            assert {replica_of(first), replica_of(second)} == set(replica_ports)
            victim = replica_of(first)
            scene = str((await first.open())["session_id"])
            kept = await first.take("l1", "Places, everyone.", sampling={"seed": 3, "max_new_tokens": 20})
            await first.request({"type": "take.keep", "take_id": kept.take_id}, "history")
            await second.open()
            other = await second.start("l1", "Not me.", sampling={"seed": 4, "max_new_tokens": 150})
            interrupted = await first.start("l2", "A long speech that goes on.",
                                            sampling={"seed": 11, "max_new_tokens": 1000})
            heard: list[np.ndarray] = []
            while sum(len(pcm) for pcm in heard) < 3 * 10 * 2048:  # three windows
                message = await first.receive()
                if isinstance(message, AudioFrame) and message.header.take_id == interrupted.take_id:
                    heard.append(message.pcm)
            os.kill(int(health(replica_ports[victim])["pid"]), signal.SIGKILL)
            with pytest.raises(ConnectionClosed) as gone:  # no close frame: the replica is gone
                while True:
                    await first.receive()
            assert gone.value.rcvd is None

            again = await reconnect(url)
            assert replica_of(again) != victim
            ready = await again.open(scene)
            takes = {take["take_id"]: take for take in ready["takes"]}  # type: ignore[union-attr, index]
            assert takes[kept.take_id]["kept"] and ready["history"] == [kept.take_id]
            cut = takes[interrupted.take_id]
            if cut["state"] != "done":  # resumed before PostgreSQL noticed the replica's death
                cut = await again.expect("take.done")
            assert (cut["finish_reason"], cut["error"]) == ("error", STOPPED_DURING_TAKE)
            samples = np.concatenate(heard)
            assert cut["frames"] * 2048 == cut["samples"] >= len(samples)
            wav = await fetch(f"http://127.0.0.1:{port}{cut['audio_url']}", Director.export_headers(scene))
            audio, _ = sf.read(io.BytesIO(wav), dtype="int16")
            np.testing.assert_array_equal(audio[:len(samples)], samples)

            finished = await second.finish(other)  # the second director never noticed
            assert finished.done["finish_reason"] == "length" and len(finished.frames) > 0
            assert (await second.request({"type": "ping", "t": 1}, "pong"))["type"] == "pong"
            await again.close()
            await second.close()

        run(main())
        # The supervisor started the killed replica again: both answer.
        for name in ("replica0", "replica1"):
            while True:
                try:
                    assert health(replica_ports[name])["status"] == "ok"
                    break
                except OSError:
                    assert deployment.poll() is None and time.monotonic() < deadline + 300, log.read_text()
                    time.sleep(0.5)
        deployment.send_signal(signal.SIGTERM)
        assert deployment.wait(timeout=120) == 0
        for name in ("replica0", "replica1"):
            with pytest.raises(OSError):
                health(replica_ports[name])
        assert not (state / "postgres" / "data" / "postmaster.pid").exists()  # PostgreSQL stopped
    finally:
        if deployment.poll() is None:
            deployment.kill()  # its parts get SIGTERM from the kernel (PR_SET_PDEATHSIG)
        deployment.wait(timeout=60)
        shutil.rmtree(state, ignore_errors=True)


def test_what_the_deployment_cannot_use_is_a_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["deploy", "--replicas", "1", "--port", str(port), "--state-dir", str(tmp_path)]) == 2
        assert capsys.readouterr().err.startswith(f"retake deploy: cannot listen on 127.0.0.1:{port} (")
        assert main(["serve", "--replicas", "2", "--port", str(port), "--data-dir", str(tmp_path)]) == 2
        assert capsys.readouterr().err.startswith(f"retake serve: cannot listen on 127.0.0.1:{port} (")
    assert main(["serve", "--replicas", "0"]) == 2
    assert capsys.readouterr().err == "retake serve: --replicas must be at least 1\n"
    assert main(["serve", "--gpus", "0", "--replicas", "2"]) == 2
    assert capsys.readouterr().err == "retake serve: give --gpus or --replicas, not both\n"
    if not torch.cuda.is_available():
        assert main(["serve", "--gpus", "0,1", "--data-dir", str(tmp_path)]) == 2
        assert capsys.readouterr().err == ("retake serve: --gpus 0,1: this machine has no CUDA GPU; to try replicas "
                                           "on the CPU use --replicas N\n")
