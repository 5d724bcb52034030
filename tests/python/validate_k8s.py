"""Validates Kubernetes objects offline, for tests/tests/kubernetes.rs.

Reads a multi-document YAML stream on stdin (the output of `kubectl kustomize`, or a manifest file). Every
built-in object is checked with kubernetes-validate (the Kubernetes OpenAPI schemas it bundles, strict: unknown
fields are errors) for each version given with --k8s; ServiceMonitor and PrometheusRule objects are checked
with jsonschema against the openAPIV3Schema of the CRD files given with --crd. Prints one JSON document:
{"objects": [...], "results": [{"kind", "name", "version", "errors": [...]}]}; exit status 0 either way (the
Rust test judges), 2 on unusable input.
"""

import argparse
import json
import sys

import jsonschema
import kubernetes_validate
import yaml


def crd_schemas(paths):
    out = {}
    for path in paths:
        with open(path) as f:
            for crd in yaml.safe_load_all(f):
                if not crd:
                    continue
                group = crd["spec"]["group"]
                kind = crd["spec"]["names"]["kind"]
                for v in crd["spec"]["versions"]:
                    out[(f"{group}/{v['name']}", kind)] = v["schema"]["openAPIV3Schema"]
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--k8s", action="append", required=True, help="Kubernetes version, e.g. 1.30.0")
    ap.add_argument("--crd", action="append", default=[], help="CRD YAML file")
    a = ap.parse_args()
    objects = [o for o in yaml.safe_load_all(sys.stdin) if o]
    if not objects:
        print("no objects on stdin", file=sys.stderr)
        return 2
    crds = crd_schemas(a.crd)
    results = []
    for o in objects:
        kind, api = o.get("kind"), o.get("apiVersion")
        name = (o.get("metadata") or {}).get("name")
        if (api, kind) in crds:
            v = jsonschema.Draft7Validator(crds[(api, kind)])
            errs = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in v.iter_errors(o)]
            results.append({"kind": kind, "name": name, "version": f"crd {api}", "errors": errs})
            continue
        for version in a.k8s:
            errs = []
            try:
                kubernetes_validate.validate(o, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                path = "/".join(map(str, e.caller.absolute_path)) if getattr(e, "caller", None) else ""
                errs.append(f"{path}: {e.message}")
            except kubernetes_validate.SchemaNotFoundError as e:
                errs.append(f"no schema: {e}")
            except kubernetes_validate.InvalidSchemaError as e:
                errs.append(f"invalid schema: {e}")
            results.append({"kind": kind, "name": name, "version": version, "errors": errs})
    json.dump({"objects": objects, "results": results}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
