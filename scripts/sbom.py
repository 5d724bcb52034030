#!/usr/bin/env python3
"""CycloneDX 1.6 JSON SBOM of the Startline binaries, from `cargo metadata` and Cargo.lock (no extra tool).

Every crate of the locked tree that startline-collector and startline-agent depend on for the host platform is
a component: normal dependencies (compiled into the binaries, proc-macros included) with scope "required", and
build dependencies (build scripts, code generators; not in the binaries) with scope "excluded". Each carries its
purl (pkg:cargo/NAME@VERSION), its licence as Cargo.toml states it, and for registry crates the SHA-256 that
Cargo.lock records for the .crate file. `dependencies` is the resolved graph between them.

    scripts/sbom.py [--out FILE]      (default: stdout)

Validated against the official CycloneDX 1.6 JSON schema by tests/tests/release.rs (scripts/release.sh ships it
as startline-VERSION.cdx.json).
"""

import argparse
import datetime
import json
import os
import subprocess
import sys
import tomllib
import uuid

ROOTS = ["startline-collector", "startline-agent"]


def cargo_metadata():
    host = subprocess.run(["rustc", "-vV"], capture_output=True, text=True, check=True).stdout
    triple = next(l.split(": ", 1)[1] for l in host.splitlines() if l.startswith("host: "))
    out = subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--locked", "--filter-platform", triple],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.loads(out), triple


def tree(edges, triple):
    """(name, version) of every crate `cargo tree` shows for the binaries with these edge kinds."""
    cmd = ["cargo", "tree", "--locked", "--prefix", "none", "--format", "{p}", "--target", triple, "-e", ",".join(edges)]
    for r in ROOTS:
        cmd += ["-p", r]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    found = set()
    for line in out.splitlines():
        words = line.split()
        if len(words) >= 2 and words[1].startswith("v"):
            found.add((words[0], words[1][1:]))
    return found


def purl(pkg):
    return f"pkg:cargo/{pkg['name']}@{pkg['version']}"


def licence(pkg):
    text = pkg.get("license")
    if not text:
        return []
    # Cargo's licence field is an SPDX expression; old crates wrote "MIT/Apache-2.0", which is not one.
    if "/" in text:
        return [{"expression": " OR ".join(p.strip() for p in text.split("/"))}]
    return [{"expression": text}]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write here instead of stdout")
    a = ap.parse_args()

    meta, triple = cargo_metadata()
    root_dir = meta["workspace_root"]
    with open(os.path.join(root_dir, "Cargo.lock"), "rb") as f:
        lock = tomllib.load(f)
    checksums = {(p["name"], p["version"]): p.get("checksum") for p in lock["package"]}
    pkgs = {p["id"]: p for p in meta["packages"]}
    nodes = {n["id"]: n for n in meta["resolve"]["nodes"]}
    roots = [pid for pid, p in pkgs.items() if p["name"] in ROOTS]
    if len(roots) != len(ROOTS):
        sys.exit(f"sbom.py: packages {ROOTS} not found in cargo metadata")

    # Which crates: cargo's own resolution for the two binaries on this platform (`cargo tree`, features as a
    # `cargo build -p ...` of them activates them; the workspace-wide `cargo metadata` graph also holds crates
    # only the tests' features pull in). Normal edges: "required"; reached only through build edges: "excluded".
    by_key = {(p["name"], p["version"]): pid for pid, p in pkgs.items()}
    required = tree(["normal"], triple) & set(by_key)
    everything = tree(["normal", "build"], triple) & set(by_key)
    required = {by_key[k] for k in required}
    excluded = {by_key[k] for k in everything} - required
    members = set(meta["workspace_members"])

    version = pkgs[roots[0]]["version"]
    components = []
    for pid in sorted(required | excluded, key=lambda i: (pkgs[i]["name"], pkgs[i]["version"])):
        p = pkgs[pid]
        c = {
            "type": "application" if p["name"] in ROOTS else "library",
            "bom-ref": purl(p),
            "name": p["name"],
            "version": p["version"],
            "scope": "required" if pid in required else "excluded",
            "purl": purl(p),
        }
        if p.get("description"):
            c["description"] = " ".join(p["description"].split())
        lic = licence(p)
        if lic:
            c["licenses"] = lic
        digest = checksums.get((p["name"], p["version"]))
        if digest:
            c["hashes"] = [{"alg": "SHA-256", "content": digest}]
        refs = []
        if p.get("repository"):
            refs.append({"type": "vcs", "url": p["repository"]})
        if p.get("homepage"):
            refs.append({"type": "website", "url": p["homepage"]})
        if refs:
            c["externalReferences"] = refs
        if pid in members:
            c["properties"] = [{"name": "cargo:workspace_member", "value": "true"}]
        components.append(c)

    included = required | excluded
    dependencies = []
    for pid in sorted(included, key=lambda i: purl(pkgs[i])):
        deps = sorted({purl(pkgs[d["pkg"]]) for d in nodes[pid]["deps"] if d["pkg"] in included
                       and any(k["kind"] in (None, "build") for k in d["dep_kinds"])})
        dependencies.append({"ref": purl(pkgs[pid]), "dependsOn": deps})
    top = "pkg:generic/startline@" + version
    dependencies.append({"ref": top, "dependsOn": sorted(purl(pkgs[r]) for r in roots)})

    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    when = datetime.datetime.fromtimestamp(int(epoch), datetime.timezone.utc) if epoch else datetime.datetime.now(datetime.timezone.utc)
    bom = {
        "bomFormat": "CycloneDX",
        "specVersion": "1.6",
        "serialNumber": f"urn:uuid:{uuid.uuid4()}",
        "version": 1,
        "metadata": {
            "timestamp": when.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "tools": {"components": [{"type": "application", "name": "startline scripts/sbom.py", "version": version}]},
            "component": {
                "type": "application",
                "bom-ref": top,
                "name": "startline",
                "version": version,
                "purl": top,
                "licenses": licence(pkgs[roots[0]]),
            },
            "properties": [{"name": "cargo:target", "value": triple}],
        },
        "components": components,
        "dependencies": dependencies,
    }
    text = json.dumps(bom, indent=2) + "\n"
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
