#!/usr/bin/env python3
"""The CRD's OpenAPI schema and the C++ validation (`tessera validate --json`) agree.

usage: schema_agreement.py TESSERA_BIN CRD CORPUS EXAMPLES_DIR [KUBECONFIG]

For every case of the corpus (tests/api/manifests.yaml) and every example manifest:
  - valid cases: the C++ validation and the schema accept them;
  - invalid cases: the C++ validation reports the expected field; with `schema: reject` the schema
    rejects the manifest at that same field, otherwise (a rule between fields, or metadata that the
    API server checks itself) the schema accepts it;
  - every field the schema rejects, the C++ validation reports too.
Then the two know the same fields: at every object of the schema, an unknown key is reported by the
C++ validation together with the list of known keys, which must equal the schema's properties.
Every one of those fields has a description (what `kubectl explain` shows; metadata, which the API
server forbids describing, aside).
The schema is applied as the API server does with strict field validation (`kubectl apply
--validate=strict`): unknown fields are errors, null values are dropped before validation.

With a KUBECONFIG (a test API server with the CRD installed: tests/api/crd_apiserver_test.sh),
every manifest is also sent to the server (`kubectl create --dry-run=server`): it must accept the
valid ones and the rules between fields, and reject the others at the same field (its paths carry
no list indices). Kubernetes 1.20 drops unknown fields instead of rejecting them, so those cases are
left out of this check.
"""
import copy
import glob
import json
import os
import re
import subprocess
import sys
import tempfile

import jsonschema
import yaml

tessera, crd_file, corpus_file, examples_dir = sys.argv[1:5]
kubeconfig = sys.argv[5] if len(sys.argv) > 5 else None

crd = yaml.safe_load(open(crd_file))
version = crd["spec"]["versions"][0]
schema = version["schema"]["openAPIV3Schema"]


def strict(s):
    """Unknown fields become errors: additionalProperties false where properties are listed."""
    s = copy.deepcopy(s)
    if s.get("type") == "object" and "properties" in s and "additionalProperties" not in s:
        s["additionalProperties"] = False
    for key in ("properties",):
        for name, sub in list(s.get(key, {}).items()):
            s[key][name] = strict(sub)
    if isinstance(s.get("items"), dict):
        s["items"] = strict(s["items"])
    if isinstance(s.get("additionalProperties"), dict):
        s["additionalProperties"] = strict(s["additionalProperties"])
    return s


validator = jsonschema.Draft4Validator(strict(schema))


def undescribed(s, path):
    out = []
    for name, sub in s.get("properties", {}).items():
        p = f"{path}.{name}" if path else name
        if not str(sub.get("description", "")).strip() and p != "metadata":
            out.append(p)
        out += undescribed(sub, p)
    if isinstance(s.get("items"), dict):
        out += undescribed(s["items"], path + "[]")
    return out


missing_descriptions = undescribed(schema, "")
if missing_descriptions:
    sys.exit(f"schema_agreement: {len(missing_descriptions)} CRD fields have no description: {', '.join(missing_descriptions)}")


def drop_nulls(v):
    if isinstance(v, dict):
        return {k: drop_nulls(x) for k, x in v.items() if x is not None}
    if isinstance(v, list):
        return [drop_nulls(x) for x in v]
    return v


def path_of(parts):
    out = ""
    for p in parts:
        out += "[%d]" % p if isinstance(p, int) else ("." if out else "") + p
    return out


def schema_fields(manifest):
    fields = set()
    for e in validator.iter_errors(drop_nulls(manifest)):
        base = path_of(e.absolute_path)
        if e.validator == "required":
            names = re.findall(r"'([^']+)' is a required property", e.message)
        elif e.validator == "additionalProperties":
            names = re.findall(r"'([^']+)'", e.message.split("(")[-1])
        else:
            names = [None]
        for n in names:
            fields.add(base if n is None else (base + "." + n if base else n))
    return fields


def cxx_problems(manifest):
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump(manifest, f, sort_keys=False)
        name = f.name
    try:
        r = subprocess.run([tessera, "validate", "--json", name], capture_output=True, text=True)
        if r.returncode not in (0, 2):
            raise RuntimeError("tessera validate failed: %s %s" % (r.stdout, r.stderr))
        return json.loads(r.stdout)["problems"]
    finally:
        os.unlink(name)


def server_verdict(manifest):
    """(accepted, output) of the test API server for a manifest."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump(manifest, f, sort_keys=False)
        name = f.name
    try:
        r = subprocess.run(["kubectl", "--kubeconfig", kubeconfig, "create", "--dry-run=server", "--validate=false",
                            "-f", name], capture_output=True, text=True)
        return r.returncode == 0, (r.stdout + r.stderr).strip()
    finally:
        os.unlink(name)


def merge(base, patch):
    if not isinstance(base, dict) or not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(base)
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge(out.get(k), v)
    return out


failures = []
server_checked = []
corpus = yaml.safe_load(open(corpus_file))
checked = 0

valid = [(c["name"], merge(corpus["base"], c["patch"])) for c in corpus["valid"]]
valid += [(os.path.basename(p), yaml.safe_load(open(p))) for p in sorted(glob.glob(os.path.join(examples_dir, "*.yaml")))]
for name, manifest in valid:
    got = cxx_problems(manifest)
    sf = schema_fields(manifest)
    if got:
        failures.append("%s: valid, but the C++ validation reports %s" % (name, got))
    if sf:
        failures.append("%s: valid, but the schema rejects %s" % (name, sorted(sf)))
    if kubeconfig:
        ok, out = server_verdict(manifest)
        if not ok:
            failures.append("%s: valid, but the API server rejects it: %s" % (name, out))
    checked += 1

for case in corpus["invalid"]:
    name, want, kind = case["name"], case["field"], case["schema"]
    manifest = merge(corpus["base"], case["patch"])
    fields = {p["field"] for p in cxx_problems(manifest)}
    sf = schema_fields(manifest)
    if want not in fields:
        failures.append("%s: the C++ validation does not report %s (it reports %s)" % (name, want, sorted(fields)))
    if kind == "reject" and want not in sf:
        failures.append("%s: the schema does not reject %s (it rejects %s)" % (name, want, sorted(sf)))
    if kind in ("accept", "server") and sf:
        failures.append("%s: a %s case, but the schema rejects %s" % (name, kind, sorted(sf)))
    missing = sf - fields
    if missing:
        failures.append("%s: the schema rejects %s, which the C++ validation does not report" % (name, sorted(missing)))
    problems = cxx_problems(manifest)
    unknown_field = any(p["field"] == want and p["reason"].startswith("unknown field") for p in problems)
    if kubeconfig and not unknown_field:
        ok, out = server_verdict(manifest)
        if kind == "accept" and not ok:
            failures.append("%s: a rule between fields, but the API server rejects it: %s" % (name, out))
        if kind in ("reject", "server") and ok:
            failures.append("%s: the API server accepts it" % name)
        if kind == "reject" and not ok and re.sub(r"\[\d+\]", "", want) not in out:
            failures.append("%s: the API server rejects it elsewhere than %s: %s" % (name, want, out))
        server_checked.append(name)
    checked += 1


def objects(s, path, example):
    """(path, properties, a minimal manifest fragment reaching it) for each object under spec."""
    if s.get("type") == "object" and "properties" in s:
        yield path, set(s["properties"]), example
        for k, sub in s["properties"].items():
            yield from objects(sub, path + [k], example)
    elif s.get("type") == "array" and s.get("items", {}).get("type") == "object":
        yield from objects(s["items"], path + [0], example)


unknown = "zzUnknown"
for path, props, _ in objects(schema["properties"]["spec"], ["spec"], None):
    manifest = copy.deepcopy(corpus["base"])
    node = manifest
    for i, p in enumerate(path):
        nxt = path[i + 1] if i + 1 < len(path) else None
        if isinstance(p, int):
            while len(node) <= p:
                node.append({})
            node = node[p]
            continue
        if not isinstance(node.get(p), (dict, list)):
            node[p] = [] if isinstance(nxt, int) else {}
        node = node[p]
    node[unknown] = 1
    want = path_of(path + [unknown])
    reason = [p["reason"] for p in cxx_problems(manifest) if p["field"] == want]
    if not reason:
        failures.append("%s: the C++ validation does not report the unknown field" % want)
        continue
    m = re.search(r"known: ([^)]*)\)", reason[0])
    known = set(m.group(1).split(", ")) if m else set()
    if known != props:
        failures.append("%s: C++ knows %s, the schema %s" % (path_of(path), sorted(known), sorted(props)))
    checked += 1

for name, ok in (("short name tj", "tj" in crd["spec"]["names"].get("shortNames", [])),
                 ("status subresource", "status" in version.get("subresources", {})),
                 ("printer columns", [c["name"] for c in version.get("additionalPrinterColumns", []) if c.get("priority", 0) == 0]
                  == ["Phase", "Training", "Epoch", "Samples/s", "Age"])):
    if not ok:
        failures.append("CRD: " + name)

print("checked %d manifests and objects: %d valid, %d invalid (%d rejected by the schema too)" % (
    checked, len(valid), len(corpus["invalid"]), sum(1 for c in corpus["invalid"] if c["schema"] == "reject")))
if kubeconfig:
    print("the API server agreed on %d valid manifests and %d invalid ones" % (len(valid), len(server_checked)))
for f in failures:
    print("FAIL " + f)
sys.exit(1 if failures else 0)
