"""Rebuild openapi-subset.json from GitHub's full OpenAPI description.

Source used: npm package @octokit/openapi 23.0.2, file generated/api.github.com.json
(GitHub's github/rest-api-description api.github.com.json plus `x-octokit` keys, which are stripped).
Usage: python tests/github_api/build_subset.py FULL_SPEC.json [--no-examples] > tests/github_api/openapi-subset.json
(the vendored file keeps examples: tests/github_server.py answers with them; see README.md here)
"""
import json
import sys

OPERATIONS = [
    "issues/list-comments", "issues/create-comment", "issues/update-comment", "issues/delete-comment",
    "repos/list-pull-requests-associated-with-commit", "repos/create-commit-status",
    "checks/create", "checks/update", "issues/create", "issues/update", "issues/list-for-repo",
    "pulls/get", "rate-limit/get",
    "repos/get-content", "pulls/list-files", "issues/list-labels-on-issue", "repos/get",
]
EXTRA_COMPONENTS = [("headers", n) for n in ("x-rate-limit-limit", "x-rate-limit-remaining", "x-rate-limit-reset")]
METHODS = {"get", "put", "post", "delete", "options", "head", "patch", "trace"}


def strip(node, drop_examples):
    if isinstance(node, dict):
        return {k: strip(v, drop_examples) for k, v in node.items()
                if k != "x-octokit" and not (drop_examples and k in ("examples", "example"))}
    if isinstance(node, list):
        return [strip(v, drop_examples) for v in node]
    return node


def refs(node):
    if isinstance(node, dict):
        if isinstance(node.get("$ref"), str):
            yield node["$ref"]
        for v in node.values():
            yield from refs(v)
    elif isinstance(node, list):
        for v in node:
            yield from refs(v)


def main(path, drop_examples=False):
    full = json.load(open(path, encoding="utf-8"))
    paths = {}
    for p, item in full["paths"].items():
        for m, op in item.items():
            if m in METHODS and op.get("operationId") in OPERATIONS:
                paths.setdefault(p, {k: v for k, v in item.items() if k not in METHODS})[m] = op
    found = {op["operationId"] for item in paths.values() for m, op in item.items() if m in METHODS}
    assert found == set(OPERATIONS), set(OPERATIONS) - found
    paths = strip(paths, drop_examples)
    comps, todo = {}, list(refs(paths)) + [f"#/components/{k}/{n}" for k, n in EXTRA_COMPONENTS]
    while todo:
        ref = todo.pop()
        _, _, kind, name = ref.split("/", 3)
        if name in comps.setdefault(kind, {}):
            continue
        comps[kind][name] = strip(full["components"][kind][name], drop_examples)
        todo.extend(refs(comps[kind][name]))
    info = dict(full["info"], title="GitHub REST API subset for a PR-commenting CI gate",
                description="Subset of GitHub's api.github.com OpenAPI description (github/rest-api-description). "
                            "Upstream license: MIT.")
    out = {"openapi": full["openapi"], "info": info, "servers": full["servers"],
           "paths": dict(sorted(paths.items())),
           "components": {k: dict(sorted(v.items())) for k, v in sorted(comps.items())}}
    json.dump(out, sys.stdout, indent=1, sort_keys=False)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main(sys.argv[1], "--no-examples" in sys.argv)
