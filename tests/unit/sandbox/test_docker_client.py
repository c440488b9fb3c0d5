"""The Docker API boundary: bounded retries of transient failures, typed errors, no daemon needed."""

from __future__ import annotations

import docker.errors
import pytest
import requests

from dispatcher.core.sandbox_api import SandboxError
from dispatcher.sandbox.container.host import ContainerNotFound
from dispatcher.sandbox.docker.client import DockerAPI, DockerUnavailable, is_transient


def _api_error(status: int) -> docker.errors.APIError:
    response = requests.Response()
    response.status_code = status
    return docker.errors.APIError(f"status {status}", response=response, explanation=f"status {status}")


class Flaky:
    """Fails with ``error`` the first ``failures`` calls, then answers."""

    def __init__(self, failures: int, error: Exception) -> None:
        self.failures, self.error, self.calls = failures, error, 0

    def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        return "ok"


def test_what_counts_as_transient() -> None:
    assert is_transient(requests.exceptions.ConnectionError())
    assert is_transient(_api_error(503))
    assert not is_transient(_api_error(500))  # docker's 500s are mostly permanent (bad image, OCI)
    assert not is_transient(docker.errors.NotFound("gone"))


async def test_transient_failures_are_retried_then_succeed() -> None:
    api = DockerAPI(client=object(), attempts=3)
    flaky = Flaky(2, requests.exceptions.ConnectionError("refused"))
    try:
        assert await api.run("op", flaky) == "ok"
        assert flaky.calls == 3
    finally:
        await api.aclose()


async def test_retries_are_bounded_and_errors_typed() -> None:
    api = DockerAPI(client=object(), attempts=2)
    try:
        flaky = Flaky(5, requests.exceptions.ConnectionError("refused"))
        with pytest.raises(DockerUnavailable):
            await api.run("op", flaky)
        assert flaky.calls == 2
        with pytest.raises(ContainerNotFound):
            await api.run("op", Flaky(1, docker.errors.NotFound("no such container")))
        permanent = Flaky(1, _api_error(500))
        with pytest.raises(SandboxError):
            await api.run("op", permanent)
        assert permanent.calls == 1
    finally:
        await api.aclose()


async def test_calls_that_may_have_run_are_never_retried() -> None:
    api = DockerAPI(client=object(), attempts=4)
    flaky = Flaky(1, requests.exceptions.ConnectionError("reset"))
    try:
        with pytest.raises(DockerUnavailable):
            await api.run("start exec", flaky, retry=False)
        assert flaky.calls == 1
    finally:
        await api.aclose()
