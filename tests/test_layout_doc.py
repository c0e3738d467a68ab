"""docs/layout.md's tree is the package: every module it lists exists, and every module is listed."""

import re

from tests import REPO_ROOT


def _listed_modules():
    text = (REPO_ROOT / "docs" / "layout.md").read_text()
    tree = text.split("## The tree", 1)[1].split("```", 2)[1]
    stack, out = [], set()
    for line in tree.splitlines():
        m = re.match(r"^( *)(\S+)", line)
        if not m or not line.strip():
            continue
        depth, name = len(m.group(1)) // 2, m.group(2)
        stack = stack[:depth]
        if name.endswith("/"):
            stack.append(name.rstrip("/"))
        elif name.endswith(".py") and stack and stack[0] == "rllib_r3l":
            out.add("/".join(stack + [name]))
    return out


def test_the_layout_tree_lists_exactly_the_packages_modules():
    actual = {
        p.relative_to(REPO_ROOT).as_posix()
        for p in (REPO_ROOT / "rllib_r3l").rglob("*.py")
        if p.name not in ("__init__.py", "__main__.py") or p.parent.name == "rllib_r3l"
    }
    actual.discard("rllib_r3l/__main__.py")
    listed = _listed_modules()
    assert listed, "no module found in docs/layout.md's tree"
    assert sorted(actual - listed) == [], "modules missing from docs/layout.md"
    assert sorted(listed - actual) == [], "docs/layout.md lists modules that do not exist"


def test_no_module_of_the_package_is_much_over_400_lines():
    long = {
        p.relative_to(REPO_ROOT).as_posix(): n
        for p in (REPO_ROOT / "rllib_r3l").rglob("*.py")
        if (n := len(p.read_text().splitlines())) > 420
    }
    assert long == {}
