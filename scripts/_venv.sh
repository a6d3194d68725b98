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
export PATH="$VENV/bin:$PATH"

if ! command -v java >/dev/null 2>&1; then
    echo "ftlayer: WARNING: 'java' is not on PATH. Spark 4.x needs Java 17 or 21" \
         "(Debian: apt-get install openjdk-17-jre-headless). Spark tests and the demo will fail." >&2
fi
