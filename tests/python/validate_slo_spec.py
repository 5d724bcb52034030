#!/usr/bin/env python3
"""Validates `startline-collector slo export` output (YAML on stdin) against the SLO tools' schemas in
tests/fixtures/slo-export (see its SOURCES.md). Usage: validate_slo_spec.py FORMAT FIXTURES_DIR.
Prints JSON: {"docs": N, "errors": [...], "queries": [...]} (queries: every PromQL expression the documents
carry, for `promtool check rules`)."""
import glob
import json
import os
import sys

import yaml
from jsonschema import Draft7Validator


def load(path):
    with open(path) as f:
        return json.load(f)


def errors_of(validator, doc, label):
    return [f"{label}: {'/'.join(str(p) for p in e.absolute_path)}: {e.message}" for e in validator.iter_errors(doc)]


def main():
    fmt, root = sys.argv[1], sys.argv[2]
    docs = [d for d in yaml.safe_load_all(sys.stdin.read()) if d is not None]
    errors, queries = [], []
    if fmt == "pyrra":
        v = Draft7Validator(load(os.path.join(root, "pyrra/servicelevelobjective.v1alpha1.schema.json")))
        for d in docs:
            errors += errors_of(v, d, "pyrra schema")
            if d.get("apiVersion") != "pyrra.dev/v1alpha1" or d.get("kind") != "ServiceLevelObjective":
                errors.append("pyrra: apiVersion/kind")
            if not d.get("metadata", {}).get("name"):
                errors.append("pyrra: metadata.name is required")
            target = float(d["spec"]["target"])
            if not 1 <= target <= 100:
                errors.append(f"pyrra: target {target} outside 1-100")
            ratio = d["spec"]["indicator"]["ratio"]
            queries += [ratio["errors"]["metric"], ratio["total"]["metric"]]
    elif fmt == "sloth":
        v = Draft7Validator(load(os.path.join(root, "sloth/prometheus-v1.derived.schema.json")))
        if len(docs) != 1:
            errors.append(f"sloth: one spec expected, got {len(docs)}")
        for d in docs:
            errors += errors_of(v, d, "sloth derived schema")
            for slo in d.get("slos", []):
                ev = slo.get("sli", {}).get("events", {})
                if "error_query" not in ev or "total_query" not in ev:
                    errors.append(f"sloth: {slo.get('name')}: sli.events needs error_query and total_query")
                    continue
                for q in (ev["error_query"], ev["total_query"]):
                    if "{{.window}}" not in q:
                        errors.append(f"sloth: query without {{{{.window}}}}: {q}")
                    queries.append(q.replace("{{.window}}", "1m"))
                if ev["error_query"] == ev["total_query"]:
                    errors.append("sloth: error and total queries are the same")
    elif fmt == "openslo":
        from referencing import Registry, Resource
        from referencing.jsonschema import DRAFT7
        parts = [load(p) for p in glob.glob(os.path.join(root, "openslo/v1/**/*.json"), recursive=True)]
        registry = Registry().with_resources(
            [(s["$id"], Resource.from_contents(s, default_specification=DRAFT7)) for s in parts if "$id" in s]
        )
        poc = Draft7Validator(load(os.path.join(root, "openslo/v1/openslo.schema.json")), registry=registry)
        sdk = Draft7Validator(load(os.path.join(root, "openslo/v1-sdk.derived.schema.json")))
        for d in docs:
            errors += errors_of(poc, d, "openslo published schema")
            errors += errors_of(sdk, d, "openslo go-sdk rules")
            if d.get("kind") == "SLO":
                rm = d["spec"]["indicator"]["spec"]["ratioMetric"]
                for side in ("good", "bad", "total"):
                    if side in rm:
                        queries.append(rm[side]["metricSource"]["spec"]["query"])
    else:
        errors.append(f"unknown format {fmt}")
    print(json.dumps({"docs": len(docs), "errors": errors, "queries": queries}))


if __name__ == "__main__":
    main()
