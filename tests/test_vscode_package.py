"""The VS Code extension packages as an installable .vsix.

``npm run package`` (``@vscode/vsce``, a devDependency, so ``npm ci``
installs it) compiles the TypeScript (``vscode:prepublish``) and zips the
extension; ``make vscode`` writes editors/vscode/dist/quickdraft-vscode.vsix
(ignored by git), and CI stops there if packaging fails. This test packages
afresh and checks what an editor would install: the manifest, the compiled
extension (a .js for every src/*.ts, ``main`` among them) and its one runtime
dependency, and not the sources, maps, dev tools or the end-to-end rig
(``.vscodeignore``). tests/integration/test_vscode_real.py installs the same
package into a real VS Code.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

EXTENSION = Path(__file__).resolve().parent.parent / "editors" / "vscode"
VSCE = EXTENSION / "node_modules" / ".bin" / "vsce"
MAX_BYTES = 2_000_000


def package_vsix(out_dir: Path) -> Path:
    """editors/vscode packaged by its own ``npm run package`` into out_dir."""
    if shutil.which("npm") is None or not VSCE.exists():
        pytest.skip("editors/vscode has no node_modules/.bin/vsce: run `make vscode` (npm ci) first")
    out = out_dir / "quickdraft-vscode.vsix"
    done = subprocess.run(["npm", "run", "package", "--", "--out", str(out)], cwd=EXTENSION,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and out.exists(), f"npm run package failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return out


@pytest.fixture(scope="module")
def vsix(tmp_path_factory) -> Path:
    return package_vsix(tmp_path_factory.mktemp("vsix"))


def test_vsix_holds_the_manifest_the_compiled_extension_and_its_runtime_dependency(vsix):
    with zipfile.ZipFile(vsix) as z:
        names = set(z.namelist())
        shipped = json.loads(z.read("extension/package.json"))
        main = z.read("extension/" + shipped["main"].removeprefix("./")).decode()
    source = json.loads((EXTENSION / "package.json").read_text())
    assert {"extension.vsixmanifest", "extension/package.json"} <= names
    assert shipped["name"] == source["name"] and shipped["version"] == source["version"]
    assert shipped["contributes"] == source["contributes"]
    compiled = {f"extension/out/{ts.stem}.js" for ts in (EXTENSION / "src").glob("*.ts")}
    assert compiled and compiled <= names, f"missing compiled files: {sorted(compiled - names)}"
    assert "vscode-languageclient/node" in main  # the compiled extension, not a stub
    for dep in source["dependencies"]:
        assert f"extension/node_modules/{dep}/package.json" in names, f"runtime dependency {dep} not shipped"


def test_vsix_leaves_out_sources_maps_dev_tools_and_the_test_rig(vsix):
    with zipfile.ZipFile(vsix) as z:
        names = z.namelist()
    assert vsix.stat().st_size < MAX_BYTES
    source = json.loads((EXTENSION / "package.json").read_text())
    unwanted = [n for n in names if n.startswith(("extension/src/", "extension/e2e/", "extension/dist/"))
                or n.endswith((".ts", ".map", ".vsix")) or n == "extension/tsconfig.json"]
    unwanted += [n for n in names for dev in source["devDependencies"] if n.startswith(f"extension/node_modules/{dev}/")]
    assert not unwanted, f"shipped needlessly: {unwanted[:20]}"
