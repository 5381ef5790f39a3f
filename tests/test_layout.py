"""The code's shape: packages import only downward, and `pip install .` ships every package and
the files the code reads (the embedded base, the configs)."""
import ast
import os
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Lowest first. A module may import its own package and packages of lower layers, nothing else.
LAYERS = [
    {"settings"},
    {"storage", "net"},
    {"assets", "configs", "telemetry", "envs", "inference"},
    {"vlm"},
    {"rl"},
    {"actors"},
    {"placement", "serving"},
    {"controller"},
    {"sft", "deploy"},
    {"driver", "serve_app", "tools"},
]
LAYER_OF = {name: i for i, layer in enumerate(LAYERS) for name in layer}


def project_imports(path: Path) -> set[str]:
    """The project's top-level packages a module imports, anywhere in it (function bodies too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found & set(LAYER_OF)


def modules():
    for name in LAYER_OF:
        target = ROOT / name
        yield from ((name, p) for p in (target.rglob("*.py") if target.is_dir() else [ROOT / f"{name}.py"]))


def test_every_import_runs_downward():
    upward = []
    for package, path in modules():
        for target in project_imports(path):
            if target != package and LAYER_OF[target] >= LAYER_OF[package]:
                upward.append(f"{path.relative_to(ROOT)} imports {target}")
    assert not upward, upward


def test_every_python_folder_is_a_listed_package():
    listed = {line.strip().rstrip("*") for line in (ROOT / "setup.cfg").read_text().splitlines()
              if line.startswith("    ") and line.strip().endswith("*")}
    folders = {p.parent.name for p in ROOT.glob("*/*.py") if not p.parent.name.startswith(".")} - {"tests", "bench"}
    assert folders <= set(LAYER_OF) and folders <= listed, (folders - set(LAYER_OF), folders - listed)
    assert all((ROOT / f / "__init__.py").is_file() for f in folders)


def test_the_wheel_ships_every_package_and_runs_from_anywhere(tmp_path):
    import shutil
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    src = tmp_path / "src"  # the tracked files only: no stale build/ or run outputs in the wheel
    for f in tracked + [str(p.relative_to(ROOT)) for _, p in modules()]:
        (src / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, src / f)
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                          "-w", str(tmp_path / "dist"), str(src)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    [wheel] = (tmp_path / "dist").glob("visrl-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for package, path in modules():
        assert str(path.relative_to(ROOT)) in names, path
    for f in ("config.json", "model.safetensors", "tokenizer.json", "processor_config.json"):
        assert f"assets/maze-vl-base/{f}" in names, f
    assert {"configs/default.yaml", "configs/hyperpod_qwen3vl_8b.yaml", "configs/serve.yaml"} <= names
    operator_files = {str(p.relative_to(ROOT)) for p in (ROOT / "deploy").rglob("*")
                      if p.is_file() and p.suffix in (".yaml", ".yml", ".json", ".gpu", ".cpu", ".sh")}
    assert operator_files and operator_files <= names, operator_files - names  # manifests, rules, dashboards
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    code = ("import driver, serve_app, actors.local, controller.fleet, serving.adapters, sft.embedded_base, telemetry.curve\n"
            "from settings import load_config\n"
            "from vlm.load import resolve_model_path\n"
            "cfg = load_config(None, [])\n"
            "print(driver.__file__); print(resolve_model_path(cfg.trainer.policy.model.path))\n")
    away = tmp_path / "elsewhere"
    away.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site)}
    run = subprocess.run([sys.executable, "-c", code], cwd=away, capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    driver_file, model_dir = run.stdout.split()[-2:]
    assert driver_file.startswith(str(site)) and model_dir.startswith(str(site))
    cluster = subprocess.run([sys.executable, "-m", "deploy.local_cluster", "--help"], cwd=away, capture_output=True,
                             text=True, timeout=120, env=env)
    assert cluster.returncode == 0 and "add-worker" in cluster.stdout, cluster.stderr[-2000:]


def test_rl_and_actors_know_no_task():
    """The training loop and the actors see tasks only through the environment interface: from envs/
    they import the interface, the registry and the row files, nothing of the maze."""
    allowed = {"envs", "envs.base", "envs.registry", "envs.rows"}
    found = []
    for folder in ("rl", "actors"):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                    [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
                found += [f"{path.relative_to(ROOT)} imports {n}" for n in names
                          if n.split(".")[0] == "envs" and n not in allowed]
            text = path.read_text().lower()
            found += [f"{path.relative_to(ROOT)} names {w}" for w in ("optimal_moves", "maze_2d", "mazeenv")
                      if w in text]
    assert not found, found
