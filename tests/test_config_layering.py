"""Config dependencies point one way: each component owns its config dataclass, `asyncrl.config.run`
composes them, and only the modules that assemble a whole process read the composed RunConfig."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "asyncrl"
RUN = "asyncrl.config.run"
ASSEMBLERS = {  # build one process (or the run folder, or the config reference) from the whole run config
    "asyncrl/generator/build.py", "asyncrl/learner/service.py", "asyncrl/run/feeder.py", "asyncrl/run/rundir.py",
    "asyncrl/config/reference.py", "asyncrl/run/lifecycle.py",  # lifecycle.start_service: a service's config
    "asyncrl/eval/offline.py",  # the stand-alone evaluation: an engine from the run config
}


def imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return found


def test_only_assemblers_import_the_run_config():
    users = {str(p.relative_to(ROOT.parent)) for p in ROOT.rglob("*.py") if RUN in imports(p)}
    assert users <= ASSEMBLERS, f"{sorted(users - ASSEMBLERS)}: read your component's own config, not RunConfig"


def test_component_configs_import_no_assembly_or_run_config():
    for path in [*ROOT.glob("*/config.py"), *ROOT.glob("config/*.py")]:
        if str(path.relative_to(ROOT.parent)) in {"asyncrl/config/run.py", *ASSEMBLERS}:
            continue
        bad = {m for m in imports(path) if m == RUN or m.endswith((".build", ".service", ".worker", ".hub"))}
        assert not bad, f"{path.relative_to(ROOT.parent)} imports {sorted(bad)}"
