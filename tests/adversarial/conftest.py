"""The adversarial tier's shared processes: two synthetic engines and one default proxy."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from adversarial.wire import ProxyProcess, Upstreams, proxy_process, upstreams


@pytest.fixture(scope="module")
def engines() -> Iterator[Upstreams]:
    with upstreams() as ups:
        yield ups


@pytest.fixture(scope="module")
def front(engines: Upstreams, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[ProxyProcess]:
    """`kvlab proxy --workers 1` with every default, shared by a module's tests."""
    with proxy_process(engines, tmp_path_factory.mktemp("proxy")) as proxy:
        yield proxy
