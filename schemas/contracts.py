"""JSON Schema contracts for other teams, and the backward-compatibility rules.

``schemas/json/<type>.v<N>.json`` is generated from the models (``python -m schemas.contracts``)
and checked in; a test fails when it is stale. The first time a ``(type, version)`` is written,
a copy goes to ``schemas/json/released/``: that copy is the released contract and is never
rewritten. A later change to the model must stay backward compatible with it (no removed field,
no new required field, no changed type), or become a new ``schema_version``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from schemas.events.dead_letter import DeadLetter
from schemas.registry import PAYLOADS, envelope_model

CONTRACTS_DIR = Path(__file__).resolve().parent / "json"
RELEASED_DIR = CONTRACTS_DIR / "released"
DIALECT = "https://json-schema.org/draft/2020-12/schema"


def event_schema(event_type: str, version: int) -> dict[str, Any]:
    """The JSON Schema of one event (envelope + payload), with type and version fixed."""
    payload = PAYLOADS[(event_type, version)]
    schema = envelope_model(event_type, version).model_json_schema()
    schema["properties"]["type"] = {"const": event_type, "type": "string"}
    schema["properties"]["schema_version"] = {"const": version, "type": "integer"}
    schema["properties"]["tenant"]["description"] = "tenant name; with policy, the Kafka key"
    schema.update(
        {
            "$schema": DIALECT,
            "$id": f"https://mint.dev/schemas/{event_type}.v{version}.json",
            "title": f"{event_type} v{version}",
            "description": (payload.__doc__ or "").strip()
            + f"\n\nTopic: <prefix>.{payload.topic}; Kafka key: '<tenant>/<policy>' (UTF-8); "
            "value: this object as UTF-8 JSON.",
        }
    )
    return schema


def dead_letter_schema() -> dict[str, Any]:
    schema = DeadLetter.model_json_schema()
    schema.update({"$schema": DIALECT, "$id": "https://mint.dev/schemas/dead_letter.v1.json"})
    return schema


def all_schemas() -> dict[str, dict[str, Any]]:
    """File name → schema, for every supported event plus the dead-letter headers."""
    files = {f"{t}.v{v}.json": event_schema(t, v) for t, v in sorted(PAYLOADS)}
    files["dead_letter.v1.json"] = dead_letter_schema()
    return files


def render(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def write(directory: Path = CONTRACTS_DIR) -> list[str]:
    """Write the current schemas; release (copy to released/) those released for the first time.
    Returns the files whose content changed."""
    changed = []
    (directory / "released").mkdir(parents=True, exist_ok=True)
    for name, schema in all_schemas().items():
        text = render(schema)
        path = directory / name
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            changed.append(name)
        released = directory / "released" / name
        if not released.exists():
            released.write_text(text)
            changed.append(f"released/{name}")
    return changed


def stale(directory: Path = CONTRACTS_DIR) -> list[str]:
    """Files that are missing or differ from what the models generate (or that no model makes)."""
    expected = {name: render(s) for name, s in all_schemas().items()}
    out = [n for n, text in expected.items() if _read(directory / n) != text]
    out += [p.name for p in directory.glob("*.json") if p.name not in expected]
    return sorted(out)


def _read(path: Path) -> str | None:
    return path.read_text() if path.exists() else None


# Backward compatibility ---------------------------------------------------------------------


def _resolve(schema: Any, root: dict[str, Any]) -> Any:
    """Inline ``$ref``s into ``$defs`` (our models have no recursive types)."""
    if isinstance(schema, dict):
        if "$ref" in schema:
            target = root
            for part in schema["$ref"].removeprefix("#/").split("/"):
                target = target[part]
            return _resolve(target, root)
        return {k: _resolve(v, root) for k, v in schema.items() if k != "$defs"}
    if isinstance(schema, list):
        return [_resolve(v, root) for v in schema]
    return schema


def _types(schema: dict[str, Any]) -> set[str]:
    if "anyOf" in schema:
        return set().union(*(_types(s) for s in schema["anyOf"]))
    if "const" in schema:
        return {f"const:{json.dumps(schema['const'])}"}
    if "enum" in schema:
        return {f"const:{json.dumps(v)}" for v in schema["enum"]}
    t = schema.get("type")
    if t is None:
        return {"any"}
    return set(t) if isinstance(t, list) else {t}


def _accepts(new: set[str], old: set[str]) -> bool:
    if "any" in new:
        return True
    base = {"integer": "number"}
    for t in old:
        if t in new or base.get(t) in new:
            continue
        if t.startswith("const:"):
            value = json.loads(t[6:])
            kind = {bool: "boolean", int: "integer", float: "number", str: "string"}.get(
                type(value), "null" if value is None else "object"
            )
            if kind in new or base.get(kind) in new:
                continue
        return False
    return True


def _objects(schema: dict[str, Any]) -> list[dict[str, Any]]:
    if "anyOf" in schema:
        return [o for s in schema["anyOf"] for o in _objects(s)]
    return [schema] if "properties" in schema else []


def _compare(old: dict[str, Any], new: dict[str, Any], where: str, out: list[str]) -> None:
    old_t, new_t = _types(old), _types(new)
    if not _accepts(new_t, old_t):
        out.append(f"{where}: type changed from {sorted(old_t)} to {sorted(new_t)}")
        return
    for o_obj, n_obj in zip(_objects(old), _objects(new), strict=False):
        o_props, n_props = o_obj.get("properties", {}), n_obj.get("properties", {})
        for name in o_props:
            if name not in n_props:
                out.append(f"{where}.{name}: field removed")
            else:
                _compare(o_props[name], n_props[name], f"{where}.{name}", out)
        added = set(n_obj.get("required", [])) - set(o_obj.get("required", []))
        out.extend(f"{where}.{name}: new required field" for name in sorted(added))
    if "items" in old and "items" in new:
        _compare(old["items"], new["items"], f"{where}[]", out)
    if isinstance(old.get("additionalProperties"), dict) and isinstance(
        new.get("additionalProperties"), dict
    ):
        _compare(old["additionalProperties"], new["additionalProperties"], f"{where}{{}}", out)


def incompatibilities(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Why ``new`` cannot replace the released ``old`` under the same version (empty: fine)."""
    out: list[str] = []
    _compare(_resolve(old, old), _resolve(new, new), "$", out)
    return out


def check_released(directory: Path = CONTRACTS_DIR) -> dict[str, list[str]]:
    """Released contract file → incompatibilities of the current models against it."""
    current = all_schemas()
    problems = {}
    for path in sorted((directory / "released").glob("*.json")):
        if path.name not in current:
            problems[path.name] = ["released version is no longer supported (model removed)"]
            continue
        found = incompatibilities(json.loads(path.read_text()), current[path.name])
        if found:
            problems[path.name] = found
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if stale or incompatible")
    args = parser.parse_args(argv)
    if args.check:
        bad = stale()
        problems = check_released()
        for name in bad:
            print(f"stale: schemas/json/{name} (run python -m schemas.contracts)")
        for name, found in problems.items():
            print(f"incompatible with released {name}: {'; '.join(found)}")
        return 1 if bad or problems else 0
    for name in write():
        print(f"wrote schemas/json/{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
