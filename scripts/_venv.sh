# Sourced by the other scripts: create or refresh .venv so that a fresh clone
# needs nothing installed by hand. The venv is rebuilt only when pyproject.toml
# changes (its hash is kept in a stamp file), so repeat runs start in seconds.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${FTLAYER_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"

if ! command -v "$PY" >/dev/null 2>&1; then
    echo "ftlayer: '$PY' not found; install Python 3.10+ (or set PYTHON=...)" >&2
    exit 2
fi
if [ ! -x "$VENV/bin/python" ]; then
    echo "ftlayer: creating virtualenv in $VENV" >&2
    "$PY" -m venv "$VENV"
fi
stamp="$VENV/.ftlayer-stamp"
want="$( (cat "$ROOT/pyproject.toml"; "$VENV/bin/python" --version) | sha256sum | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ] \
   || ! "$VENV/bin/python" -c 'import ftlayer' >/dev/null 2>&1; then
    echo "ftlayer: installing dependencies into $VENV (first run downloads pyspark, ~450 MB)" >&2
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
    "$VENV/bin/python" -m pip install --quiet -e "$ROOT[spark,dev]"
    echo "$want" > "$stamp"
fi
# The start-up hook that lets Spark's Python processes import the installed, compiled pyspark
# instead of pyspark.zip (runtime/spark/installed_pyspark.py). The wheel carries it (setup.py); an
# editable install does not, so it is copied here, on every run, so that a change reaches the venv.
pth="$ROOT/runtime/spark/ftlayer-installed-pyspark.pth"
site="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
cmp -s "$pth" "$site/$(basename "$pth")" || cp "$pth" "$site/"
export PATH="$VENV/bin:$PATH"
# Byte-compile the checkout (the editable install's modules and the tests), about 1 CPU-s the first
# time and 0.2 s when nothing changed. Every Python process of a run imports ftlayer from here: the
# suite's and the demo's Spark workers, planner and source-runner processes, subprocess drivers and
# CLI calls. Where PYTHONDONTWRITEBYTECODE is set (as on this project's CI machines) none of them
# caches what it compiles, and each spent about 0.2 CPU-s compiling ftlayer again. Python reads an
# existing, up-to-date .pyc whatever that setting; a stale one (an edited file) is compiled in
# memory as before, until the next script run refreshes it.
"$VENV/bin/python" -m compileall -q -j 0 "$ROOT/ftlayer" "$ROOT/runtime" "$ROOT/serialization" \
    "$ROOT/partitioners" "$ROOT/tests" >/dev/null || echo "ftlayer: WARNING: byte-compiling the checkout failed" >&2

# The MQTT tests run a real Mosquitto broker (runtime/driver/mosquitto.py); install it when
# missing, as root with apt-get (tests/conftest.py tries the same, and fails the tests if it cannot).
if ! command -v mosquitto >/dev/null 2>&1 && [ ! -x /usr/sbin/mosquitto ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "ftlayer: installing mosquitto (the broker of the MQTT tests) with apt-get" >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q mosquitto >/dev/null 2>&1 \
            || { apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q mosquitto >/dev/null; } \
            || echo "ftlayer: WARNING: could not install mosquitto; the MQTT tests will fail" >&2
    else
        echo "ftlayer: WARNING: 'mosquitto' is not installed (Debian: apt-get install mosquitto);" \
             "the MQTT tests will fail." >&2
    fi
fi
# scripts/test lints the server-side Lua (ftlayer/lua/) with luacheck, from Debian's lua-check;
# install it when missing, as root with apt-get, as mosquitto above.
if ! command -v luacheck >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "ftlayer: installing luacheck (lua-check, the Lua linter of scripts/test) with apt-get" >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q lua-check >/dev/null 2>&1 \
            || { apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q lua-check >/dev/null; } \
            || echo "ftlayer: WARNING: could not install lua-check; scripts/test will fail at luacheck" >&2
    else
        echo "ftlayer: WARNING: 'luacheck' is not installed (Debian: apt-get install lua-check);" \
             "scripts/test will fail at luacheck." >&2
    fi
fi
if ! command -v java >/dev/null 2>&1; then
    echo "ftlayer: WARNING: 'java' is not on PATH. Spark 4.x needs Java 17 or 21" \
         "(Debian: apt-get install openjdk-17-jre-headless). Spark tests and the demo will fail." >&2
fi
