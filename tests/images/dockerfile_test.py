#!/usr/bin/env python3
"""Checks the images' Dockerfiles (images/*.Dockerfile) without a container engine: every base is
pinned (an exact version or date tag, or a digest; never latest or a moving tag; `scratch` is no
pull), every build runs
the project's own Makefile, the final stage runs as a non-root USER, the ENTRYPOINT is a binary the
build produces (an add_executable target) copied into the final stage, and the final stage's
packages exist in this machine's Debian archive and provide every shared library the binary needs
(readelf NEEDED of the binary built here, each library's Debian package installed by the stage or
pulled in by one it installs).

  dockerfile_test.py SOURCE_DIR BIN_DIR
"""
import glob
import os
import re
import subprocess
import sys

BASE_PACKAGES = {"libc6", "libstdc++6", "libgcc-s1"}  # in every Debian base image


def instructions(path):
    """(instruction, argument) pairs, continuation lines joined, comments dropped."""
    out, cur = [], ""
    for line in open(path):
        s = line.rstrip("\n")
        if not cur and (not s.strip() or s.lstrip().startswith("#")):
            continue
        if s.endswith("\\"):
            cur += s[:-1] + " "
            continue
        cur += s
        word, _, rest = cur.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        cur = ""
    return out


def pinned(image):
    if "@sha256:" in image:
        return True
    name, _, tag = image.rpartition(":")
    if not name or "/" in tag or not tag or tag == "latest":
        return False
    # An exact version (12.6.3) or a dated tag (bookworm-20241111-slim).
    return bool(re.search(r"\d+\.\d+\.\d+", tag) or re.search(r"(19|20)\d{6}", tag))


def executables(src):
    names = set()
    for cm in glob.glob(os.path.join(src, "**", "CMakeLists.txt"), recursive=True):
        if "/build" in cm[len(src):]:
            continue
        names.update(re.findall(r"add_executable\(\s*([\w-]+)", open(cm).read()))
    return names


def package_of(lib):
    r = subprocess.run(["dpkg", "-S", lib], capture_output=True, text=True)
    pkgs = set()
    for line in r.stdout.splitlines():
        pkg, _, path = line.partition(": ")
        if os.path.basename(path) == lib:
            pkgs.add(pkg.split(":")[0])
    return pkgs


def depends(pkg):
    r = subprocess.run(["apt-cache", "depends", "--no-recommends", "--no-suggests", pkg], capture_output=True, text=True)
    return {l.split(":", 1)[1].strip().split(":")[0] for l in r.stdout.splitlines() if l.strip().startswith(("Depends:", "PreDepends:"))}


def check(path, src, bin_dir, built):
    problems = []
    ins = instructions(path)
    args = {}
    stages = []  # (base, [instructions])
    names = {r.split()[-1] for w, r in ins if w == "FROM" and len(r.split()) == 3 and r.split()[1].upper() == "AS"}
    for word, rest in ins:
        if word == "ARG" and not stages:
            k, _, v = rest.partition("=")
            args[k] = v
        elif word == "FROM":
            image = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), rest.split()[0])
            stages.append((image, []))
            if "${" in image:
                problems.append(f"FROM {rest}: an ARG without a default")
            elif image not in names and image != "scratch" and not pinned(image):
                problems.append(f"FROM {image}: the base is not pinned (an exact version, a date or a digest)")
        elif stages:
            stages[-1][1].append((word, rest))
    if not stages:
        return [f"{path}: no FROM"]
    if not any(w == "RUN" and re.search(r"\bmake\b", r) for _, st in stages[:-1] for w, r in st):
        problems.append("no build stage runs the project's Makefile (make)")
    final = stages[-1][1]
    users = [r for w, r in final if w == "USER"]
    if not users:
        problems.append("the final stage sets no USER (it would run as root)")
    else:
        user = users[-1].split(":")[0]
        if user in ("root", "0"):
            problems.append(f"USER {users[-1]}: root")
    entry = [r for w, r in final if w == "ENTRYPOINT"]
    if not entry or not entry[-1].startswith("["):
        problems.append("the final stage has no exec-form ENTRYPOINT")
    else:
        binary = eval(entry[-1])[0]  # a JSON list of strings
        name = os.path.basename(binary)
        if name not in built:
            problems.append(f"ENTRYPOINT {binary}: {name} is not a binary the build produces ({sorted(built)})")
        copied = [r for w, r in final if w == "COPY" and re.search(r"--from=(build|binaries)\b", r) and
                  (name in r or r.split()[1].endswith("/"))]
        if not copied:
            problems.append(f"ENTRYPOINT {binary}: not copied from the build stage into the final stage")
        # The runtime packages exist here and provide what the binary needs.
        installed = set()
        for w, r in final:
            if w == "RUN" and "apt-get install" in r:
                tail = r.split("apt-get install", 1)[1].split("&&")[0]
                installed.update(t for t in tail.split() if not t.startswith("-"))
        for pkg in sorted(installed):
            r = subprocess.run(["apt-cache", "policy", pkg], capture_output=True, text=True)
            if "Candidate:" not in r.stdout or "Candidate: (none)" in r.stdout:
                problems.append(f"package {pkg} is not in this machine's Debian archive")
        provided = set(installed) | BASE_PACKAGES
        for pkg in list(installed):
            provided |= depends(pkg)
        exe = os.path.join(bin_dir, name)
        if os.path.exists(exe):
            needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]",
                                subprocess.run(["readelf", "-d", exe], capture_output=True, text=True).stdout)
            for lib in needed:
                if lib.startswith(("libcuda", "libcudart", "libnccl", "libcudnn", "libcublas")):
                    continue  # copied from the CUDA image
                owners = package_of(lib)
                if owners and not owners & provided:
                    problems.append(f"{name} needs {lib} (package {', '.join(sorted(owners))}), which the final stage does not install")
        else:
            problems.append(f"{exe} is not built: cannot check its libraries")
    return problems


def main():
    src, bin_dir = sys.argv[1], sys.argv[2]
    built = executables(src)
    files = sorted(glob.glob(os.path.join(src, "images", "*.Dockerfile")))
    if len(files) < 2:
        sys.exit(f"dockerfile_test: expected the controller's and the worker's Dockerfiles in images/, found {files}")
    failed = False
    for f in files:
        problems = check(f, src, bin_dir, built)
        for p in problems:
            print(f"FAIL {os.path.relpath(f, src)}: {p}")
        if not problems:
            print(f"PASS {os.path.relpath(f, src)}")
        failed |= bool(problems)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
