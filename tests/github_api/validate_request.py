"""Validate GitHub REST API JSON bodies against openapi-subset.json (OpenAPI 3.0.3).

    from validate_request import validate_request, validate_response
    validate_request("POST", "/repos/o/r/issues/7/comments", {"body": "hi"})   # -> [] when valid
    validate_response("POST", "/repos/o/r/issues/7/comments", 201, payload)   # -> list of error strings

CLI: python validate_request.py METHOD PATH [BODY.json | -]   (exit 0 valid, 1 invalid, 2 unknown route)
Needs: jsonschema >= 4.18 (brings `referencing`).
"""
import json
import re
import sys
from functools import cache
from pathlib import Path
from urllib.parse import urlsplit

from jsonschema import Draft4Validator
from jsonschema.exceptions import best_match
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT4

SPEC_PATH = Path(__file__).with_name("openapi-subset.json")
URI = "urn:github-openapi-subset"


def _nullable(node):
    """Rewrite OpenAPI 3.0 `nullable: true` into plain JSON Schema."""
    if isinstance(node, list):
        return [_nullable(v) for v in node]
    if not isinstance(node, dict):
        return node
    node = {k: _nullable(v) for k, v in node.items()}
    if node.get("nullable") is True:
        del node["nullable"]
        if "enum" in node and None not in node["enum"]:
            node["enum"] = [*node["enum"], None]
        if isinstance(node.get("type"), str):
            node["type"] = [node["type"], "null"]
        elif "type" not in node:
            node = {"anyOf": [node, {"type": "null"}]}
    return node


@cache
def _load():
    spec = _nullable(json.loads(SPEC_PATH.read_text(encoding="utf-8")))
    registry = Registry().with_resource(URI, Resource.from_contents(spec, default_specification=DRAFT4))
    routes = sorted(((tmpl.count("{"), re.compile("^" + re.sub(r"\{[^/}]+\}", "[^/]+", tmpl) + "$"), tmpl)
                     for tmpl in spec["paths"]), key=lambda r: r[0])
    return spec, registry, [(rx, tmpl) for _, rx, tmpl in routes]


def _ptr(*parts):
    return "#/" + "/".join(str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def find_operation(method, path):
    """Return (path template, operation object); raise LookupError if not in the subset."""
    spec, _, routes = _load()
    path, method = urlsplit(path).path.rstrip("/") or "/", method.lower()
    for rx, tmpl in routes:
        if rx.match(path) and method in spec["paths"][tmpl]:
            return tmpl, spec["paths"][tmpl][method]
    raise LookupError(f"{method.upper()} {path} is not in the GitHub API subset")


def _errors(pointer, instance):
    _, registry, _ = _load()
    validator = Draft4Validator({"$ref": URI + pointer}, registry=registry)
    out = []
    for err in sorted(validator.iter_errors(instance), key=lambda e: list(e.absolute_path)):
        err = best_match(err.context) if err.context else err
        out.append(f"{'/'.join(map(str, err.absolute_path)) or '(body)'}: {err.message}")
    return out


def validate_request(method, path, body):
    """Errors (list of str, empty when valid) for a request body; body is parsed JSON or None."""
    tmpl, op = find_operation(method, path)
    content = op.get("requestBody", {}).get("content", {})
    if "application/json" not in content:
        return [] if body is None else [f"{op['operationId']} takes no JSON body"]
    if body is None:
        return [f"{op['operationId']} requires a JSON body"] if op["requestBody"].get("required") else []
    return _errors(_ptr("paths", tmpl, method.lower(), "requestBody", "content", "application/json", "schema"), body)


def validate_response(method, path, status, body):
    """Errors for a response body, per the operation's documented status code."""
    tmpl, op = find_operation(method, path)
    resp = op["responses"].get(str(status))
    if resp is None:
        return [f"{op['operationId']} documents no {status} response"]
    base = resp["$ref"] if "$ref" in resp else _ptr("paths", tmpl, method.lower(), "responses", status)
    if "$ref" in resp:
        resp = _load()[0]["components"]["responses"][resp["$ref"].rsplit("/", 1)[1]]
    if "application/json" not in resp.get("content", {}):
        return [] if body is None else [f"{op['operationId']} {status} has no JSON body"]
    return _errors(base + "/content/application~1json/schema", body)


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    raw = None if len(sys.argv) == 3 else (sys.stdin if sys.argv[3] == "-" else open(sys.argv[3])).read()
    try:
        problems = validate_request(sys.argv[1], sys.argv[2], None if raw is None else json.loads(raw))
    except LookupError as exc:
        print(exc, file=sys.stderr)
        sys.exit(2)
    print("\n".join(problems) or "valid")
    sys.exit(1 if problems else 0)
