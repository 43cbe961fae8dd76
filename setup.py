"""Compiles ``protos/`` into ``extproc/_proto`` whenever the package is built or installed."""

from __future__ import annotations

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).parent
OUT = ROOT / "extproc" / "_proto"


def compile_protos() -> None:
    import grpc_tools
    from grpc_tools import protoc

    include = Path(grpc_tools.__file__).parent / "_proto"
    for proto in sorted((ROOT / "protos").rglob("*.proto")):
        args = [
            "protoc",
            f"-I{ROOT / 'protos'}",
            f"-I{include}",
            f"--python_out={OUT}",
            f"--pyi_out={OUT}",
            f"--grpc_python_out={OUT}",
            str(proto),
        ]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed on {proto}")
    # protoc writes saar/v1/x_pb2.py with absolute imports; flatten into the package.
    generated = sorted({*OUT.rglob("*_pb2*.py"), *OUT.rglob("*_pb2*.pyi")})
    packages = {".".join(g.parent.relative_to(OUT).parts) for g in generated if g.parent != OUT}
    for path in generated:
        text = path.read_text()
        for package in packages:
            text = text.replace(f"from {package} import", "from . import")
        path.unlink()
        (OUT / path.name).write_text(text)
    for folder in sorted((p for p in OUT.rglob("*") if p.is_dir()), reverse=True):
        folder.rmdir()


class BuildWithProtos(build_py):
    def run(self) -> None:
        compile_protos()
        super().run()


setup(cmdclass={"build_py": BuildWithProtos})
