"""The smoke server's fixtures (`tests.serving.smoke_server`), built once per test process for
every module that uses them (package scope): loading, quantizing and compiling it is most of their
time. Those modules share one xdist group, so one worker builds it."""

from __future__ import annotations

import httpx
import pytest

from fp4rl.serving.server import BackgroundServer, ServeConfig, load_service
from tests.serving.smoke_server import ENGINE, MODEL, openai_client


@pytest.fixture(scope="package")
def server(warmup_dir):
    config = ServeConfig(checkpoint=str(warmup_dir), quantization="nvfp4_online", impl="reference", engine=ENGINE,
                         max_wait_ms=20.0, model_name=MODEL)
    service = load_service(config)
    background = BackgroundServer(service).start()
    yield background, service
    background.stop()
    service.close()


@pytest.fixture(scope="package")
def client(server):
    with httpx.Client(base_url=server[0].url, timeout=60.0) as client:
        yield client


@pytest.fixture(scope="package")
def oai(server):
    with openai_client(server[0].url) as client:
        yield client
