# straw's tasks.  Run through the bootstrap: `python3 dev.py <recipe>` (it sets up .venv).
python := justfile_directory() + "/.venv/bin/python"

# The library's main job on an embedded default pool (temp directory).
demo *ARGS:
    {{python}} -m straw.demo {{ARGS}}

# The whole test suite (lint, types, then pytest; JuiceFS tests install fuse3 when root).
test *ARGS: lint
    {{python}} tests/ensure_juicefs_deps.py
    {{python}} -m pytest -q {{ARGS}}

lint:
    {{python}} -m ruff check straw spec model fault_injection bench tests
    {{python}} -m mypy straw spec
