"""Fixtures of the API test server for this package's tests."""

from tests.support.apiserver import apiserver, kube, shared_apiserver

__all__ = ["apiserver", "kube", "shared_apiserver"]
