"""Regenerate the Python bindings of the kubelet protos.

Run ``python -m dra_driver.proto.generate`` after changing a ``.proto`` file; the
generated modules are committed and ``tests/unit/test_proto_wire.py`` fails when
they are stale.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

__all__ = ["PROTO_FILES", "generate", "main"]

PROTO_ROOT = Path(__file__).resolve().parent
REPO_ROOT = PROTO_ROOT.parent.parent
PROTO_FILES = sorted(p.relative_to(REPO_ROOT) for p in PROTO_ROOT.glob("*/api.proto"))
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")


def generate(out_dir: Path) -> list[Path]:
    """Compile every proto into ``out_dir`` (mirroring the repo layout); return the files written."""
    from grpc_tools import protoc  # build-time only dependency

    protoc_include = Path(protoc.__file__).resolve().parent / "_proto"
    # mypy-protobuf's plugins sit beside the interpreter, which need not be on PATH.
    bin_dir = Path(sys.executable).parent
    args = [
        "grpc_tools.protoc",
        f"--plugin=protoc-gen-mypy={bin_dir / 'protoc-gen-mypy'}",
        f"--plugin=protoc-gen-mypy_grpc={bin_dir / 'protoc-gen-mypy_grpc'}",
        f"-I{REPO_ROOT}",
        f"-I{protoc_include}",
        f"--python_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        f"--mypy_out={out_dir}",
        f"--mypy_grpc_out={out_dir}",
        *[str(p) for p in PROTO_FILES],
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed for {', '.join(map(str, PROTO_FILES))}")
    return sorted(p for p in out_dir.rglob("*") if p.name.endswith(GENERATED_SUFFIXES))


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        for path in generate(Path(tmp)):
            target = REPO_ROOT / path.relative_to(tmp)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
            print(f"wrote {target.relative_to(REPO_ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
