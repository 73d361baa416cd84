"""The CDI specification's own JSON Schema (``../shared/cdi-schema``: CNCF container-device-interface,
``schema/``; never copied into this repository), for checking the spec files the plugin writes the
way a runtime's CDI library reads them.

    from tests.support.cdischema import assert_valid_cdi_spec
    assert_valid_cdi_spec(path)   # jsonschema's message on failure, naming the place in the file
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
from referencing import Registry
from referencing.jsonschema import DRAFT7

from tests.support.deploy import REPO_ROOT

__all__ = ["CDI_SCHEMA_DIR", "assert_valid_cdi_spec", "cdi_schema_errors"]

CDI_SCHEMA_DIR = REPO_ROOT.parent / "shared" / "cdi-schema"


@cache
def _validator() -> jsonschema.Draft7Validator:
    schema = json.loads((CDI_SCHEMA_DIR / "schema.json").read_text())
    defs = json.loads((CDI_SCHEMA_DIR / "defs.json").read_text())
    # schema.json refers to "defs.json#/definitions/…": registered under that name (defs.json names
    # no $schema of its own; it is draft-07 as schema.json)
    registry: Registry[Any] = Registry().with_resource("defs.json", DRAFT7.create_resource(defs))
    return jsonschema.Draft7Validator(schema, registry=registry)


def cdi_schema_errors(document: Any) -> list[str]:
    """What the CDI schema finds wrong with ``document``, one line each (none: valid)."""
    return [
        f"{'/'.join(str(p) for p in error.absolute_path) or '(top)'}: {error.message}"
        for error in _validator().iter_errors(document)
    ]


def assert_valid_cdi_spec(path: Path) -> dict[str, Any]:
    """The spec file at ``path`` as JSON, after checking it against the CDI schema."""
    document: dict[str, Any] = json.loads(path.read_text())
    errors = cdi_schema_errors(document)
    assert errors == [], f"{path.name} breaks the CDI schema: {errors}"
    return document
