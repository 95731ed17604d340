#!/usr/bin/env python3
"""The Pod Security Standards' baseline and restricted levels, checked on pod specs: what the
PodSecurity admission of Kubernetes 1.23+ enforces, which the test cluster's API server (1.20) does
not have. Reads Pods, Deployments or pod templates (JSON or YAML, one object or a List) and prints
each pod's level and the rules it breaks.

  pod_security.py FILE [--expect restricted|baseline|privileged] [--allow RULE...]

--expect: exit 1 unless every pod meets that level (a rule named by --allow is not counted).
"""
import argparse
import json
import sys

import yaml

# Volume types the restricted level allows (everything but hostPath is baseline).
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                      "projected", "secret"}
BASELINE_CAPS = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
                 "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}


def pod_specs(doc):
    if not doc:
        return
    kind = doc.get("kind")
    if kind == "List" or "items" in doc:
        for item in doc.get("items", []):
            yield from pod_specs(item)
    elif kind == "Pod":
        yield doc["metadata"]["name"], doc["spec"]
    elif "template" in doc.get("spec", {}):
        yield doc["metadata"]["name"], doc["spec"]["template"]["spec"]


def violations(spec):
    """[(level, rule, detail)]: level is the lowest the rule allows ("baseline" rules break both)."""
    out = []
    pod_sc = spec.get("securityContext") or {}
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(flag):
            out.append(("baseline", "hostNamespaces", flag))
    for v in spec.get("volumes") or []:
        kinds = [k for k in v if k != "name"]
        if "hostPath" in kinds:
            out.append(("baseline", "hostPathVolumes", v["name"]))
        elif not set(kinds) <= RESTRICTED_VOLUMES:
            out.append(("restricted", "volumeTypes", f"{v['name']}: {kinds}"))
    if pod_sc.get("sysctls"):
        out.append(("baseline", "sysctls", str(pod_sc["sysctls"])))
    containers = [("initContainers", c) for c in spec.get("initContainers") or []] + \
                 [("containers", c) for c in spec.get("containers") or []]
    pod_seccomp = (pod_sc.get("seccompProfile") or {}).get("type")
    for _, c in containers:
        name = c["name"]
        sc = c.get("securityContext") or {}
        if sc.get("privileged"):
            out.append(("baseline", "privileged", name))
        caps = sc.get("capabilities") or {}
        added = set(caps.get("add") or [])
        if added - BASELINE_CAPS:
            out.append(("baseline", "capabilities", f"{name} adds {sorted(added - BASELINE_CAPS)}"))
        if added - {"NET_BIND_SERVICE"}:
            out.append(("restricted", "capabilities", f"{name} adds {sorted(added - {'NET_BIND_SERVICE'})}"))
        if "ALL" not in (caps.get("drop") or []):
            out.append(("restricted", "capabilities", f"{name} does not drop ALL"))
        for p in c.get("ports") or []:
            if p.get("hostPort"):
                out.append(("baseline", "hostPorts", f"{name}: {p['hostPort']}"))
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(("restricted", "allowPrivilegeEscalation", name))
        non_root = sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot"))
        user = sc.get("runAsUser", pod_sc.get("runAsUser"))
        if user == 0:
            out.append(("restricted", "runAsUser", f"{name} runs as uid 0"))
        if non_root is not True and not (user is not None and user != 0 and non_root is not False):
            out.append(("restricted", "runAsNonRoot", name))
        seccomp = (sc.get("seccompProfile") or {}).get("type", pod_seccomp)
        if seccomp == "Unconfined":
            out.append(("baseline", "seccompProfile", name))
        elif seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(("restricted", "seccompProfile", name))
    return out


def level(vs):
    if any(l == "baseline" for l, _, _ in vs):
        return "privileged"
    if vs:
        return "baseline"
    return "restricted"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("file")
    p.add_argument("--expect", choices=["restricted", "baseline", "privileged"])
    p.add_argument("--allow", nargs="*", default=[], help="rules not counted against --expect")
    o = p.parse_args()
    text = open(o.file).read()
    docs = list(yaml.safe_load_all(text))
    rank = {"privileged": 0, "baseline": 1, "restricted": 2}
    ok, seen = True, 0
    for doc in docs:
        for name, spec in pod_specs(doc):
            seen += 1
            vs = violations(spec)
            counted = [v for v in vs if v[1] not in o.allow]
            got = level(vs)
            print(f"{name}: {got}" + "".join(f"\n  {l} {r}: {d}" for l, r, d in vs))
            if o.expect and rank[level(counted)] < rank[o.expect]:
                ok = False
    if seen == 0:
        sys.exit(f"pod_security: no pod spec in {o.file}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
