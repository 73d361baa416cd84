"""Claim UIDs for tests that attach without a ResourceClaim object: the manager accepts only
Kubernetes UIDs (UUID form), so a made-up claim name becomes a stable UUID."""

from __future__ import annotations

import uuid

__all__ = ["claim_uid"]


def claim_uid(name: str) -> str:
    """The same UUID for the same ``name`` in every test and run."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"fabric-dra-test-claim:{name}"))
