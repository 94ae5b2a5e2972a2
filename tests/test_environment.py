"""environment.yml (conda) and pyproject.toml (pip) must describe one environment."""

import re
import sys
from pathlib import Path

import yaml
from packaging.specifiers import SpecifierSet
from packaging.version import Version

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]


def _pyproject():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _conda_env():
    return yaml.safe_load((ROOT / "environment.yml").read_text())


def _pip_section(env):
    for dep in env["dependencies"]:
        if isinstance(dep, dict) and "pip" in dep:
            return dep["pip"]
    raise AssertionError("environment.yml has no pip section")


def _pins(requirements):
    """{name: version} for every `name==version` requirement."""
    pins = {}
    for req in requirements:
        m = re.fullmatch(r"([A-Za-z0-9_.\-]+)\s*==\s*([^\s;]+)", req.strip())
        if m:
            pins[m.group(1).lower().replace("_", "-")] = m.group(2)
    return pins


def test_environment_installs_the_project_with_every_environment_extra():
    extras = set(_pyproject()["project"]["optional-dependencies"])
    lines = [line for line in _pip_section(_conda_env()) if line.startswith("-e")]
    assert len(lines) == 1, f"expected one editable install of the project, got {lines}"
    m = re.fullmatch(r"-e\s+\.\[([a-z,\s]+)\]", lines[0])
    assert m, f"the editable install must be `-e .[extras]`, got {lines[0]!r}"
    wanted = {e.strip() for e in m.group(1).split(",")}
    # The environment is the book + test environment; "analysis" is a subset of "book".
    assert wanted == {"book", "test"}, wanted
    assert wanted <= extras, f"environment.yml asks for extras pyproject lacks: {wanted - extras}"


def test_environment_python_satisfies_requires_python():
    requires = SpecifierSet(_pyproject()["project"]["requires-python"])
    pythons = [
        d for d in _conda_env()["dependencies"] if isinstance(d, str) and d.startswith("python")
    ]
    assert len(pythons) == 1, pythons
    version = pythons[0].split("=", 1)[1].lstrip("=")
    assert Version(version) in requires, f"python {version} does not satisfy {requires}"


def test_pins_agree_across_extras_and_environment():
    """A package pinned twice (two extras, or an extra and environment.yml) has one version."""
    seen: dict[str, tuple[str, str]] = {}
    sources = {f"extra {k}": v for k, v in _pyproject()["project"]["optional-dependencies"].items()}
    sources["environment.yml"] = [d for d in _pip_section(_conda_env()) if not d.startswith("-e")]
    for source, reqs in sources.items():
        for name, version in _pins(reqs).items():
            if name in seen:
                assert seen[name][0] == version, (
                    f"{name} is pinned to {seen[name][0]} in {seen[name][1]} "
                    f"but to {version} in {source}"
                )
            seen[name] = (version, source)


def test_environment_extras_are_fully_pinned():
    """Reproducible installs: every requirement of the book and test extras is exact."""
    extras = _pyproject()["project"]["optional-dependencies"]
    for extra in ("book", "test"):
        loose = [r for r in extras[extra] if "==" not in r]
        assert not loose, f"extra {extra} has unpinned requirements: {loose}"


def test_core_dependencies_admit_the_pinned_torch():
    """The library's own range must accept the version the environment pins."""
    project = _pyproject()["project"]
    torch_req = next(r for r in project["dependencies"] if r.startswith("torch"))
    pinned = _pins(project["optional-dependencies"]["test"])["torch"]
    assert Version(pinned) in SpecifierSet(torch_req[len("torch") :]), (torch_req, pinned)
