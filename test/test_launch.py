"""Launch files, checked statically (``launch`` / ``ros2 launch`` do not exist on PyPI); run only where installed."""

import ast
import importlib.util
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
LAUNCH_FILES = sorted((ROOT / "launch").glob("*.launch.py"))


def _console_scripts() -> set[str]:
    tree = ast.parse((ROOT / "setup.py").read_text())
    scripts = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and "=" in node.value and ":" in node.value:
            scripts.add(node.value.split("=")[0].strip())
    return scripts


def _calls(tree: ast.AST, name: str) -> list[ast.Call]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == name]


def _kw(call: ast.Call, key: str):
    for kw in call.keywords:
        if kw.arg == key:
            return kw.value
    return None


@pytest.mark.parametrize("path", LAUNCH_FILES, ids=lambda p: p.name)
def test_launch_file_is_consistent(path):
    tree = ast.parse(path.read_text())
    assert any(isinstance(n, ast.FunctionDef) and n.name == "generate_launch_description" for n in tree.body)
    nodes = _calls(tree, "LifecycleNode") + _calls(tree, "Node")
    assert nodes, "no node started"
    scripts = _console_scripts()
    cmake = (ROOT / "CMakeLists.txt").read_text()
    for call in nodes:
        package, executable = _kw(call, "package"), _kw(call, "executable")
        assert package.value == "wamdiff_ros"
        assert executable.value in scripts, f"{executable.value} is not a console script"
        assert executable.value in cmake, f"{executable.value} is not installed into lib/wamdiff_ros by CMake"
    # every file under the package share it names exists in the repository
    for const in (n for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)):
        if re.fullmatch(r"[\w.-]+\.(yaml|xml)", const.value):
            assert (ROOT / "config" / const.value).is_file(), const.value
    # the launch arguments it declares are exactly the ones it uses
    declared = set(_module_dicts(tree)["ARGUMENTS"])
    used = _used_arguments(tree)
    assert used <= declared, f"used, not declared: {used - declared}"
    assert declared <= used, f"declared, never used: {declared - used}"


def _module_dicts(tree: ast.Module) -> dict[str, dict]:
    out = {}
    for n in tree.body:
        if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name) and isinstance(n.value, ast.Dict):
            out[n.targets[0].id] = {ast.literal_eval(k): None for k in n.value.keys}
    return out


def _used_arguments(tree: ast.Module) -> set[str]:
    """Names read with ``LaunchConfiguration(...)`` / ``arg(...)``: constants, and the keys of a module-level dict a
    comprehension reads them from (``{name: arg(name) for name, kind in TYPES.items()}``)."""
    dicts, used = _module_dicts(tree), set()
    for c in ast.walk(tree):
        if isinstance(c, ast.Call) and getattr(c.func, "id", None) in ("LaunchConfiguration", "arg") and c.args:
            if isinstance(c.args[0], ast.Constant):
                used.add(c.args[0].value)
    for comp in (n for n in ast.walk(tree) if isinstance(n, (ast.DictComp, ast.ListComp, ast.SetComp))):
        names = {c.args[0].id for c in ast.walk(comp) if isinstance(c, ast.Call) and c.args
                 and getattr(c.func, "id", None) in ("LaunchConfiguration", "arg") and isinstance(c.args[0], ast.Name)}
        for gen in comp.generators:
            called = isinstance(gen.iter, ast.Call) and isinstance(gen.iter.func, ast.Attribute)
            source = gen.iter.func.value if called else gen.iter
            targets = {t.id for t in ast.walk(gen.target) if isinstance(t, ast.Name)}
            if names & targets and isinstance(source, ast.Name) and source.id in dicts:
                used |= set(dicts[source.id])
    return used


def test_fastdds_profile_enlarges_the_shared_memory_segment():
    text = (ROOT / "config" / "fastdds.xml").read_text()
    size = int(re.search(r"<segment_size>(\d+)</segment_size>", text).group(1))
    assert size >= 4 * 640 * 480 * 3


@pytest.mark.skipif(importlib.util.find_spec("launch") is None or importlib.util.find_spec("launch_ros") is None,
                    reason="ROS 2 launch is not installed (not on PyPI)")
@pytest.mark.parametrize("path", LAUNCH_FILES, ids=lambda p: p.name)
def test_launch_description_builds(path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.generate_launch_description().entities


def test_installed_prefix_holds_every_launched_executable(monkeypatch):
    import os
    import sys

    ament = pytest.importorskip("ament_index_python.packages", reason="ament_index_python not installed")
    prefixes = [p for p in os.environ.get("AMENT_PREFIX_PATH", "").split(os.pathsep) if p]
    monkeypatch.setenv("AMENT_PREFIX_PATH", os.pathsep.join(prefixes + [sys.prefix]))  # make setup's prefix
    try:
        prefix = ament.get_package_prefix("wamdiff_ros")
    except ament.PackageNotFoundError:
        pytest.skip("wamdiff_ros is not installed into an ament prefix (make setup / colcon build)")

    for path in LAUNCH_FILES:
        for call in _calls(ast.parse(path.read_text()), "LifecycleNode") + _calls(ast.parse(path.read_text()), "Node"):
            exe = Path(prefix) / "lib" / "wamdiff_ros" / _kw(call, "executable").value
            assert exe.is_file() and os.access(exe, os.X_OK), exe


def test_rviz_config_shows_the_nodes_outputs_and_is_installed():
    config = yaml.safe_load((ROOT / "rviz" / "wamdiff.rviz").read_text())["Visualization Manager"]
    topics = {d["Topic"]["Value"] for d in config["Displays"] if "Topic" in d}
    node = "".join((ROOT / "wamdiff_ros" / "ros" / name).read_text() for name in ("node.py", "outputs.py"))
    for topic in topics:  # a topic the node publishes (outputs.py holds its publishers)
        assert topic.startswith("/wamdiff_planner/") and f'"~/{topic.split("/", 2)[2]}"' in node, topic
    assert {"/wamdiff_planner/output/path", "/wamdiff_planner/debug/markers", "/wamdiff_planner/debug/image"} <= topics
    assert config["Global Options"]["Fixed Frame"] == "odom"
    assert re.search(r"install\(DIRECTORY [^)]*\brviz\b", (ROOT / "CMakeLists.txt").read_text())


def test_an_included_launch_file_gets_only_arguments_it_declares():
    """bench2drive.launch.py includes planner.launch.py: every launch argument it passes is one that file declares."""
    tree = ast.parse((ROOT / "launch" / "bench2drive.launch.py").read_text())
    (include,) = _calls(tree, "IncludeLaunchDescription")
    passed = {k.value for k in _kw(include, "launch_arguments").func.value.keys}
    declared = set(_module_dicts(ast.parse((ROOT / "launch" / "planner.launch.py").read_text()))["ARGUMENTS"])
    assert passed and passed <= declared, passed - declared
