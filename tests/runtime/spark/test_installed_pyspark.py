"""runtime/spark/installed_pyspark.py: which path entries duplicate the installed pyspark (pure, on
real directory trees), and the start-up hook in real Python processes of a venv that has it
(``layered_venv``), with the paths Spark gives its Python processes. No Spark here:
test_installed_pyspark_spark.py runs a query.
"""

from __future__ import annotations

import json
import os
import subprocess
import zipfile
from pathlib import Path

import pytest

from runtime.spark.installed_pyspark import OPT_OUT_ENV, PTH_NAME, prefer_installed, redundant_entries
from tests.runtime.spark.layered_venv import HOOK, ROOT, layered_venv

PY4J = "0.10.9.9"


def site_with_pyspark(site: Path, py4j_version: str = PY4J) -> dict[str, str]:
    """A site-packages tree as a pip-installed pyspark lays it out; its Spark paths by name."""
    home = site / "pyspark"
    (home / "python" / "lib").mkdir(parents=True)
    (home / "jars").mkdir()
    (home / "__init__.py").write_text("")
    (site / "py4j").mkdir()
    (site / "py4j" / "__init__.py").write_text("")
    (site / "py4j" / "version.py").write_text(f"__version__ = '{py4j_version}'\n")
    paths = {"zip": home / "python" / "lib" / "pyspark.zip",
             "py4j": home / "python" / "lib" / f"py4j-{PY4J}-src.zip",
             "jar": home / "jars" / "spark-core_2.13-4.3.0.jar"}
    for p in paths.values():
        p.write_bytes(b"")
    return {k: str(v) for k, v in paths.items()}


def test_a_pip_installed_pyspark_s_own_zips_and_jar_are_redundant(tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    spark = site_with_pyspark(site)
    path = [str(tmp_path), spark["zip"], spark["py4j"], spark["jar"], "/usr/lib/python3.11", str(site)]
    assert redundant_entries(path) == [spark["zip"], spark["py4j"], spark["jar"]]


def test_a_spark_home_reached_through_a_symlink_is_the_same_installation(tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    site_with_pyspark(site)
    (tmp_path / "spark-home").symlink_to(site / "pyspark")
    zip_ = str(tmp_path / "spark-home" / "python" / "lib" / "pyspark.zip")
    assert redundant_entries([zip_, str(site)]) == [zip_]


def test_a_spark_distribution_as_spark_home_keeps_every_entry(tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    site_with_pyspark(site)
    dist = tmp_path / "opt-spark"  # a Spark distribution: python/lib/pyspark.zip, no pyspark package at its top
    (dist / "python" / "lib").mkdir(parents=True)
    (dist / "jars").mkdir()
    names = [dist / "python" / "lib" / "pyspark.zip", dist / "python" / "lib" / f"py4j-{PY4J}-src.zip",
             dist / "jars" / "spark-core_2.13-4.3.0.jar"]
    for p in names:
        p.write_bytes(b"")
    assert redundant_entries([*map(str, names), str(site)]) == []
    other = site_with_pyspark(tmp_path / "other-site-packages")  # another pip-installed pyspark, not the first
    assert redundant_entries([other["zip"], other["py4j"], other["jar"], str(site)]) == []


def test_nothing_is_redundant_without_an_installed_pyspark(tmp_path: Path) -> None:
    spark = site_with_pyspark(tmp_path / "site-packages")
    assert redundant_entries([spark["zip"], spark["py4j"], spark["jar"], str(tmp_path / "elsewhere")]) == []
    assert redundant_entries(["/usr/lib/python3.11", str(tmp_path)]) == []


def test_an_earlier_pyspark_on_the_path_is_the_installed_one(tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    spark = site_with_pyspark(site)
    shadow = tmp_path / "shadow"
    (shadow / "pyspark").mkdir(parents=True)
    (shadow / "pyspark" / "__init__.py").write_text("")
    assert redundant_entries([spark["zip"], str(shadow), str(site)]) == []


def test_a_py4j_of_another_version_keeps_its_zip(tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    spark = site_with_pyspark(site, py4j_version="0.10.9.7")
    assert redundant_entries([spark["zip"], spark["py4j"], spark["jar"], str(site)]) == [spark["zip"], spark["jar"]]


def test_prefer_installed_edits_the_path_unless_opted_out(tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    spark = site_with_pyspark(site)
    path = [spark["zip"], spark["py4j"], spark["jar"], str(site)]
    kept = list(path)
    assert prefer_installed({OPT_OUT_ENV: "1"}, kept) == []
    assert kept == path
    assert prefer_installed({}, path) == [spark["zip"], spark["py4j"], spark["jar"]]
    assert path == [str(site)]


# --- the hook in real processes (a venv of their own: the dev venv does not get this checkout's hook)

@pytest.fixture(scope="module")
def hooked_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return layered_venv(tmp_path_factory.mktemp("venv") / "v")


def installed_pyspark_home() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("pyspark")
    assert spec is not None and spec.origin is not None
    return Path(spec.origin).parent


def spark_python_path() -> str:
    """The PYTHONPATH Spark gives its Python processes here (PythonUtils.sparkPythonPath), then this checkout."""
    home = installed_pyspark_home()
    (py4j,) = (home / "python" / "lib").glob("py4j-*-src.zip")
    (jar,) = (home / "jars").glob("spark-core_*.jar")
    return os.pathsep.join([str(home / "python" / "lib" / "pyspark.zip"), str(py4j), str(jar), str(ROOT)])


SHOW = ("import json, sys, pyspark, py4j; print(json.dumps({'pyspark': pyspark.__file__, 'py4j': py4j.__file__, "
        "'path': sys.path, 'cached': list(sys.path_importer_cache), "
        "'hook': 'runtime.spark.installed_pyspark' in sys.modules}))")


def run_shown(python: Path, pythonpath: str | None, **env: str) -> dict[str, object]:
    environ = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", OPT_OUT_ENV)}
    if pythonpath is not None:
        environ["PYTHONPATH"] = pythonpath
    environ.update(env)
    proc = subprocess.run([str(python), "-c", SHOW], env=environ, capture_output=True, text=True, timeout=60,
                          check=False)
    assert proc.returncode == 0 and not proc.stderr, proc.stderr
    shown: dict[str, object] = json.loads(proc.stdout)
    return shown


def test_a_spark_python_process_imports_the_installed_pyspark(hooked_python: Path) -> None:
    home = installed_pyspark_home()
    shown = run_shown(hooked_python, spark_python_path())
    assert shown["pyspark"] == str(home / "__init__.py")
    assert shown["py4j"] == str(home.parent / "py4j" / "__init__.py")
    gone = spark_python_path().split(os.pathsep)[:3]
    assert not set(gone) & set(shown["path"]), shown["path"]  # type: ignore[arg-type]
    assert not set(gone) & set(shown["cached"]), "invalidate_caches() would re-read them"  # type: ignore[arg-type]


def test_opted_out_a_spark_python_process_imports_the_zips(hooked_python: Path) -> None:
    shown = run_shown(hooked_python, spark_python_path(), **{OPT_OUT_ENV: "1"})
    zips = spark_python_path().split(os.pathsep)
    assert shown["pyspark"] == f"{zips[0]}/pyspark/__init__.py"
    assert shown["py4j"] == f"{zips[1]}/py4j/__init__.py"
    assert shown["path"][1:4] == zips[:3]  # type: ignore[index]


def test_another_spark_home_s_zip_is_kept(hooked_python: Path, tmp_path: Path) -> None:
    lib = tmp_path / "spark-3" / "python" / "lib"
    lib.mkdir(parents=True)
    with zipfile.ZipFile(lib / "pyspark.zip", "w") as z:  # a real zip of another pyspark
        z.writestr("pyspark/__init__.py", "ORIGIN = 'the other spark home'\n")
    shown = run_shown(hooked_python, f"{lib / 'pyspark.zip'}{os.pathsep}{ROOT}")
    assert shown["pyspark"] == f"{lib / 'pyspark.zip'}/pyspark/__init__.py"
    assert str(lib / "pyspark.zip") in shown["path"]  # type: ignore[operator]


def test_a_python_start_outside_spark_does_not_load_the_hook(hooked_python: Path) -> None:
    shown = run_shown(hooked_python, str(ROOT))
    assert shown["hook"] is False
    assert shown["pyspark"] == str(installed_pyspark_home() / "__init__.py")


def test_the_hook_file_is_one_import_line_naming_this_module() -> None:
    lines = HOOK.read_text().splitlines()
    assert HOOK.name == PTH_NAME and len(lines) == 1 and lines[0].startswith("import ")  # site exec()s such lines
    assert "runtime.spark.installed_pyspark" in lines[0] and "prefer_installed()" in lines[0]
    assert PTH_NAME > "__editable__"  # site reads .pth files sorted: setuptools' editable finder first
