#!/usr/bin/env python3
"""Writes docs/api.md, the TrainingJob field reference, from the CRD's schema (its one source).

  api_doc.py CRD.yaml OUT.md          write the reference
  api_doc.py CRD.yaml OUT.md --check  exit 1 when OUT.md is not what the CRD gives (a test runs this)

Every field of spec and status with its manifest path, type, default, allowed values and the CRD's
description, grouped by the object it belongs to.
"""
import argparse
import json
import sys

import yaml

HEADER = """# The TrainingJob API

Every field of a `TrainingJob` manifest (`apiVersion: tessera.dev/v1alpha1`), as `kubectl apply` and
`tessera run` read it, by its path in the manifest. Generated from the CustomResourceDefinition
(`charts/tessera/crds/trainingjobs.tessera.dev.yaml`) by `scripts/api_doc.py`; a test keeps the two
the same. Rules between fields (the spatial split divides the workers, the switch epoch comes before
the last one, the model's own shape rules) are checked by `tessera validate` and the controller, and
each problem names the field it is about.
"""


def kind_of(s):
    if s.get("x-kubernetes-int-or-string"):
        return "quantity (integer or string)"
    t = s.get("type", "object")
    if t == "array":
        return "list of " + kind_of(s.get("items", {}))
    return t


def allowed(s):
    parts = []
    if "enum" in s:
        parts.append(", ".join(f"`{v}`" for v in s["enum"]))
    lo, hi = s.get("minimum"), s.get("maximum")
    if lo is not None and hi is not None:
        left = "(" if s.get("exclusiveMinimum") else "["
        right = ")" if s.get("exclusiveMaximum") else "]"
        parts.append(f"{left}{lo}, {hi}{right}")
    elif lo is not None:
        parts.append(f"{'>' if s.get('exclusiveMinimum') else '>='} {lo}")
    elif hi is not None:
        parts.append(f"{'<' if s.get('exclusiveMaximum') else '<='} {hi}")
    if "pattern" in s:
        parts.append(f"matches `{s['pattern']}`")
    if "minItems" in s or "maxItems" in s:
        parts.append(f"{s.get('minItems', 0)} to {s.get('maxItems', 'any')} items")
    return "; ".join(parts)


def cell(text):
    return str(text).replace("|", "\\|").replace("\n", " ")


def walk(path, s, sections):
    """Adds a row per field under `path` to sections[object path], objects first seen first."""
    props = s.get("properties")
    if s.get("type") == "array" and isinstance(s.get("items"), dict) and s["items"].get("properties"):
        props, path = s["items"]["properties"], path + "[]"
    if not props:
        return
    rows = sections.setdefault(path, {"description": s.get("description", ""), "rows": []})["rows"]
    required = set(s.get("required", []) or (s.get("items", {}).get("required", []) if path.endswith("[]") else []))
    for name, sub in props.items():
        default = sub.get("default")
        rows.append((f"{path}.{name}", kind_of(sub) + (" (required)" if name in required else ""),
                     "" if default is None else f"`{json.dumps(default)}`",
                     allowed(sub), sub.get("description", "")))
    for name, sub in props.items():
        walk(f"{path}.{name}", sub, sections)


def render(crd):
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    out = [HEADER]
    for top in ["spec", "status"]:
        sections = {}
        walk(top, schema["properties"][top], sections)
        for path, sec in sections.items():
            out.append(f"\n## `{path}`\n")
            if sec["description"]:
                out.append(sec["description"] + "\n")
            out.append("| field | type | default | allowed | description |")
            out.append("|---|---|---|---|---|")
            for row in sec["rows"]:
                out.append("| " + " | ".join(cell(c) if i else f"`{c}`" for i, c in enumerate(row)) + " |")
    return "\n".join(out) + "\n"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("crd")
    p.add_argument("out")
    p.add_argument("--check", action="store_true")
    a = p.parse_args()
    with open(a.crd) as f:
        text = render(yaml.safe_load(f))
    if a.check:
        try:
            with open(a.out) as f:
                current = f.read()
        except OSError:
            current = ""
        if current != text:
            print(f"{a.out} is not what {a.crd} gives: run scripts/api_doc.py {a.crd} {a.out}", file=sys.stderr)
            return 1
        return 0
    with open(a.out, "w") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
