"""The package's layers, read from its import statements (every one, also those inside
functions): no import cycle; the runtime imports nothing from the kernels or the API; the
kernels import nothing from the API. See docs/design.md, "Layout"."""

import ast
import pathlib

import numba_flash

PACKAGE = pathlib.Path(numba_flash.__file__).parent
TOP = {"api", "precompile", "torch", "transformers", "distributed", "__main__"}  # above the kernels


def module_name(path):
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path):
    """The numba_flash modules that ``path`` imports (``from .x import y`` counts ``x.y`` when
    ``y`` is a module, else ``x``)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("numba_flash"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("numba_flash"):
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if (PACKAGE.parent / (sub.replace(".", "/") + ".py")).exists()
                          or (PACKAGE.parent / sub.replace(".", "/")).is_dir() else target)
    found.discard(name)
    return found


def graph():
    return {module_name(p): imports_of(p) for p in PACKAGE.rglob("*.py")}


def layer(module):
    parts = module.split(".")
    if len(parts) == 1:
        return "package"
    if parts[1] in ("runtime", "kernels"):
        return parts[1]
    return "api" if parts[1] in TOP else "host"


def test_graph_sees_the_package():
    g = graph()
    assert "numba_flash.api" in g and "numba_flash.runtime.spec" in g
    assert "numba_flash.runtime.spec" in g["numba_flash.kernels.attention"]


def test_no_import_cycle():
    g = graph()
    state, path = {}, []

    def visit(m):
        state[m] = "open"
        path.append(m)
        for n in sorted(g.get(m, ())):
            if n not in g:
                continue
            if state.get(n) == "open":
                cycle = path[path.index(n):] + [n]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if n not in state:
                visit(n)
        path.pop()
        state[m] = "done"

    for m in sorted(g):
        if m not in state:
            visit(m)


def test_layers_import_only_downwards():
    forbidden = {"runtime": {"kernels", "api", "host"}, "kernels": {"api"}, "host": {"api"}}
    bad = [f"{m} -> {n}" for m, deps in graph().items() for n in deps
           if layer(n) in forbidden.get(layer(m), ())]
    assert not bad, "imports against the layering:\n" + "\n".join(sorted(bad))
