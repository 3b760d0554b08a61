"""The house rules, read from the source (no import runs): no import cycle, counting imports inside
functions (Ray keeps such a test for its train package); no import against the layers; ``kw_only``
on every dataclass of three or more fields; few untyped signatures. The figures come from
``scripts/house_figures.py``, which a person runs too."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def house() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "house_figures", REPO / "scripts" / "house_figures.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("house_figures", module)
    spec.loader.exec_module(module)
    return module


def test_the_cycle_finder_sees_a_cycle_closed_inside_a_function(
    house: ModuleType, tmp_path: Path
) -> None:
    package = tmp_path / "sembridge_ray"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from sembridge_ray import b\n")
    (package / "b.py").write_text("def f():\n    from sembridge_ray.a import x\n")
    (package / "c.py").write_text("import sembridge_ray.b\n")
    graph = house.import_graph(tmp_path)
    assert graph["sembridge_ray.b"] == {"sembridge_ray.a": True}  # only inside a function
    assert house.cycles(graph) == [["sembridge_ray.a", "sembridge_ray.b"]]


def test_the_package_has_no_import_cycle(house: ModuleType) -> None:
    assert house.cycles(house.import_graph()) == []


def test_no_import_runs_against_the_layers(house: ModuleType) -> None:
    assert house.upward(house.import_graph()) == []


def _dataclass_decorator(node: ast.ClassDef) -> ast.expr | None:
    for decorator in node.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        if name == "dataclass":
            return decorator
    return None


def _fields(node: ast.ClassDef) -> int:
    """Annotated class attributes that are dataclass fields (``ClassVar`` ones are not)."""
    return sum(
        isinstance(s, ast.AnnAssign)
        and isinstance(s.target, ast.Name)
        and "ClassVar" not in ast.unparse(s.annotation)
        for s in node.body
    )


def _kw_only(decorator: ast.expr) -> bool:
    return isinstance(decorator, ast.Call) and any(
        k.arg == "kw_only" and isinstance(k.value, ast.Constant) and k.value.value is True
        for k in decorator.keywords
    )


def test_every_dataclass_of_three_or_more_fields_is_keyword_only() -> None:
    loose = []
    for path in sorted((REPO / "sembridge_ray").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ClassDef):
                continue
            decorator = _dataclass_decorator(node)
            if decorator is not None and _fields(node) >= 3 and not _kw_only(decorator):
                loose.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name}")
    assert loose == []


def test_the_field_counter_skips_class_variables() -> None:
    source = "@dataclass\nclass A:\n    x: int\n    y: ClassVar[int] = 1\n    z: str = ''\n    def f(self): ..."
    tree = ast.parse(source)
    (node,) = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
    assert _fields(node) == 2 and _dataclass_decorator(node) is not None


def test_few_signatures_are_untyped(house: ModuleType) -> None:
    figures = house.signature_types()
    assert figures["bare_any_share"] <= 0.02 and figures["dict_str_any_share"] <= 0.01, figures


def test_code_lines_skip_blanks_comments_and_docstrings(house: ModuleType) -> None:
    source = (
        '"""Module\ndocstring."""\n'  # 2 docstring lines
        "\n"
        "# a comment\n"
        "X = 1  # code with a comment\n"  # 1
        '"""X\'s attribute docstring."""\n'
        "def f(\n    a: int,\n) -> int:\n"  # 3
        '    """f."""\n'
        "    return (a +\n            1)\n"  # 2
    )
    assert house.code_lines(source) == 6


def test_rooms_count_shares_sizes_fan_out_and_driver_imports(
    house: ModuleType, tmp_path: Path
) -> None:
    package = tmp_path / "sembridge_ray"
    (package / "sparse").mkdir(parents=True)
    (package / "recipes" / "evaluate").mkdir(parents=True)
    (package / "recipes" / "export").mkdir()
    (package / "__init__.py").write_text("")
    (package / "sparse" / "__init__.py").write_text("")
    for folder in ("recipes", "recipes/evaluate", "recipes/export"):
        (package / folder / "__init__.py").write_text("")
    (package / "sparse" / "loss.py").write_text("A = 1\nB = 2\nC = 3\n")  # maths: 3 code lines
    (package / "config.py").write_text("D = 4\n")  # glue: 1
    (package / "text.py").write_text("E = 5\n")  # neither: 1
    (package / "recipes" / "evaluate" / "run.py").write_text("from sembridge_ray import config\n")
    (package / "recipes" / "export" / "run.py").write_text(  # glue: 2, one run -> run import
        "from sembridge_ray.recipes.evaluate import run\nfrom sembridge_ray.sparse import loss\n"
    )
    figures = house.rooms(house.import_graph(tmp_path), tmp_path)
    assert figures["code_lines"] == 8
    assert figures["maths_share"] == round(3 / 8, 3) and figures["glue_share"] == round(4 / 8, 3)
    assert figures["largest_module"] == 3 and figures["largest_fan_out"] == 2
    assert figures["driver_imports"] == 1 and figures["recipe_imports"] == 1
