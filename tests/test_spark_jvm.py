"""The suite's JVM set-up (tests/spark_jvm.py): the tests' conf reaches every JVM through
``SPARK_SUBMIT_OPTS``, quoted so Spark's launcher splits it back into the same options."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from tests import spark_jvm


def test_the_conf_file_becomes_driver_flags_and_system_properties() -> None:
    conf = spark_jvm.read_conf()
    parts = shlex.split(spark_jvm.submit_opts(conf))
    driver = shlex.split(conf[spark_jvm.DRIVER_OPTIONS])
    assert parts[: len(driver)] == driver
    for key, value in conf.items():
        if key != spark_jvm.DRIVER_OPTIONS:
            assert f"-D{key}={value}" in parts  # one element, spaces and all
    assert "-Dspark.executor.defaultJavaOptions=" + conf["spark.executor.defaultJavaOptions"] in parts
    assert not any("Archive" in p for p in parts)


def test_the_archive_is_mapped_by_driver_and_executors_and_dumped_by_the_driver_alone() -> None:
    conf = spark_jvm.read_conf()
    archive = Path("/x/a.jsa")
    mapped = shlex.split(spark_jvm.submit_opts(conf, archive))
    assert "-XX:SharedArchiveFile=/x/a.jsa" in mapped and spark_jvm.QUIET_CDS in mapped
    executor = next(p for p in mapped if p.startswith("-Dspark.executor.defaultJavaOptions="))
    assert executor.endswith(f"-XX:SharedArchiveFile=/x/a.jsa {spark_jvm.QUIET_CDS}")
    dumped = shlex.split(spark_jvm.submit_opts(conf, archive, dump=True))
    assert "-XX:ArchiveClassesAtExit=/x/a.jsa" in dumped
    assert "-Dspark.executor.defaultJavaOptions=" + conf["spark.executor.defaultJavaOptions"] in dumped


def test_read_conf_skips_comments_and_keeps_values_with_spaces(tmp_path: Path) -> None:
    path = tmp_path / "spark-defaults.conf"
    path.write_text("# a comment\n\nspark.a 1\nspark.b -X -Y  \n")
    assert spark_jvm.read_conf(path) == {"spark.a": "1", "spark.b": "-X -Y"}


def test_a_conf_dir_set_by_the_caller_wins() -> None:
    env = {"SPARK_CONF_DIR": "/mine"}
    spark_jvm.configure(env)
    assert env == {"SPARK_CONF_DIR": "/mine"}


def test_configure_points_at_an_empty_conf_dir_and_names_the_archive_only_when_built() -> None:
    env: dict[str, str] = {}
    spark_jvm.configure(env)
    assert not any(Path(env["SPARK_CONF_DIR"]).iterdir())  # the JVM refuses a non-empty one in an archive
    archive = spark_jvm.archive_path(spark_jvm.read_conf())
    assert (f"-XX:SharedArchiveFile={archive}" in shlex.split(env["SPARK_SUBMIT_OPTS"])) == archive.is_file()


@pytest.mark.spark
def test_the_session_jvm_runs_with_the_tests_conf(spark) -> None:  # type: ignore[no-untyped-def]
    conf = spark_jvm.read_conf()
    assert spark.conf.get("spark.sql.streaming.pollingDelay") == conf["spark.sql.streaming.pollingDelay"]
    executor = spark.sparkContext.getConf().get("spark.executor.defaultJavaOptions")
    assert executor.startswith(conf["spark.executor.defaultJavaOptions"])  # + the archive, once built
    jvm = spark.sparkContext._jvm
    args = list(jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
    for flag in shlex.split(conf[spark_jvm.DRIVER_OPTIONS]):
        assert flag in args
