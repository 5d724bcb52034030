#!/usr/bin/env python3
"""Validates a CycloneDX JSON document against the official schema in tests/fixtures/cyclonedx/ (offline: the
schema's references to spdx.schema.json and jsf-0.82.schema.json resolve to the copies beside it).

    validate_cyclonedx.py BOM.json        prints {"errors": [...]} and exits 0 either way
"""
import json
import sys
from pathlib import Path

import jsonschema
from referencing import Registry, Resource

here = Path(__file__).resolve().parent.parent / "fixtures" / "cyclonedx"
bom = json.loads(Path(sys.argv[1]).read_text())
version = bom.get("specVersion", "1.6")
schemas = {f.name: json.loads(f.read_text()) for f in here.glob("*.schema.json")}
resources = []
for name, s in schemas.items():
    resources.append((name, Resource.from_contents(s)))
    resources.append((f"http://cyclonedx.org/schema/{name}", Resource.from_contents(s)))
main = schemas.get(f"bom-{version}.schema.json", schemas["bom-1.6.schema.json"])
validator = jsonschema.Draft7Validator(main, registry=Registry().with_resources(resources),
                                       format_checker=jsonschema.Draft7Validator.FORMAT_CHECKER)
errors = [f"{'/'.join(str(p) for p in e.absolute_path)}: {e.message}" for e in validator.iter_errors(bom)]
json.dump({"schema": main.get("$id"), "errors": errors}, sys.stdout)
