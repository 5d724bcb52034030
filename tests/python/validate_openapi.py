#!/usr/bin/env python3
"""Checks the collector's OpenAPI document and real answers against it.

usage: validate_openapi.py OPENAPI_JSON EXAMPLES_JSON

1. The document is valid OpenAPI (PyPI openapi-spec-validator, which picks the 3.1 schema from `openapi`).
2. Each example (a real request made by tests/tests/openapi.rs: method, documented path, URL, status, content
   type, body) is checked against its operation: the status is documented, the query parameters are documented,
   the media type is the documented one, and a JSON body validates against the response schema (JSON Schema
   2020-12 with the document's components, via jsonschema).
3. Every documented operation has at least one example, so no route goes unchecked.

Prints one line per failure and exits 1 if there is any.
"""
import json
import sys
from urllib.parse import parse_qsl, urlsplit

import jsonschema
from openapi_spec_validator import validate


def main() -> int:
    doc = json.load(open(sys.argv[1]))
    examples = json.load(open(sys.argv[2]))
    validate(doc)
    failures = []
    seen = set()
    checked = 0
    for ex in examples:
        where = f"{ex['method'].upper()} {ex['url']} -> {ex['status']}"
        op = doc["paths"].get(ex["path"], {}).get(ex["method"])
        if op is None:
            failures.append(f"{where}: {ex['method']} {ex['path']} is not documented")
            continue
        seen.add((ex["method"], ex["path"]))
        documented = {p["name"] for p in op.get("parameters", []) if p["in"] == "query"}
        for name, _ in parse_qsl(urlsplit(ex["url"]).query, keep_blank_values=True):
            if name not in documented and not ex.get("undocumented_param_expected"):
                failures.append(f"{where}: query parameter {name!r} is not documented")
        resp = op["responses"].get(str(ex["status"]))
        if resp is None:
            failures.append(f"{where}: status {ex['status']} is not documented (has {sorted(op['responses'])})")
            continue
        content = resp.get("content", {})
        media = ex["content_type"].split(";")[0].strip()
        if not content:
            if ex["body"]:
                failures.append(f"{where}: a body where none is documented")
            checked += 1
            continue
        if media not in content:
            failures.append(f"{where}: content type {media!r} is not documented ({sorted(content)})")
            continue
        schema = content[media]["schema"]
        if media == "application/json":
            try:
                body = json.loads(ex["body"])
            except ValueError as e:
                failures.append(f"{where}: body is not JSON: {e}")
                continue
            # The response schema, resolved against the whole document (its $refs point into components).
            root = {"$schema": "https://json-schema.org/draft/2020-12/schema", "components": doc["components"]}
            root.update({"allOf": [schema]})
            validator = jsonschema.Draft202012Validator(root)
            errors = sorted(validator.iter_errors(body), key=lambda e: list(e.absolute_path))
            for e in errors[:5]:
                failures.append(f"{where}: at {'/'.join(map(str, e.absolute_path)) or '(root)'}: {e.message[:300]}")
        elif schema.get("type") == "string" and not isinstance(ex["body"], str):
            failures.append(f"{where}: body is not text")
        checked += 1
    for path, ops in doc["paths"].items():
        for method in ops:
            if (method, path) not in seen:
                failures.append(f"{method.upper()} {path}: documented but no example was checked")
    for f in failures:
        print(f)
    print(f"{checked} examples checked against {sum(len(o) for o in doc['paths'].values())} operations, "
          f"{len(doc['components']['schemas'])} schemas; {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
