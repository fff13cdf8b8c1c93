"""``straw qualify``: every clause passes on a sound filesystem (SimFS, a temp dir, two
JuiceFS mounts) and fails on its negative control; NFS's default caches fail the
staleness clauses; JuiceFS mounted with unsafe cache options is flagged."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from fault_injection.nfs import nfs_client, parse_options
from fault_injection.qualify_controls import (
    CONTROLS,
    Offsets32,
    SwallowENOSPC,
    sim_env,
)
from fault_injection.simfs import SimFS
from straw import DeploymentMismatch, SharedFilesystemStore
from straw.backend import FilesystemBackend
from straw.clock import ManualClock, SystemClock
from straw.fs import PosixFS
from straw.qualify import QualifyInputError, implied_settings, prepare, retry_window, run
from straw.qualify.clauses import CLAUSES, FAIL, PASS, SKIP, Client, Env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# clauses that need real files (sparse 16 GiB offsets, a filesystem that fills up)
REAL_ONLY = ("large_offsets", "full_filesystem")
SIM_CLAUSES = [n for n in CLAUSES if n not in REAL_ONLY]


def _real_env(tmp_path, fs=None, **kw) -> Env:
    d = tmp_path / "q"
    d.mkdir(exist_ok=True)
    c = Client(fs or PosixFS(), str(d))
    return Env(a=c, b=c, clock=SystemClock(), token="q", rounds=2, deadline=2.0, **kw)


def test_every_clause_passes_on_two_simfs_clients():
    env, _ = sim_env()
    for name in SIM_CLAUSES:
        r = CLAUSES[name](env)
        expected = SKIP if name == "mount_options" else PASS  # SimFS has no mount table
        assert r.verdict == expected, (name, r.detail)


@pytest.mark.parametrize("clause", sorted(CONTROLS))
def test_negative_control_fails_its_clause(clause):
    r = CLAUSES[clause](CONTROLS[clause]())
    assert r.verdict == FAIL, r.detail


def test_large_offsets_passes_on_a_real_dir_and_fails_on_32_bit_offsets(tmp_path):
    assert CLAUSES["large_offsets"](_real_env(tmp_path)).verdict == PASS
    r = CLAUSES["large_offsets"](_real_env(tmp_path, fs=Offsets32(PosixFS())))
    assert r.verdict == FAIL and "reads other bytes back" in r.detail


def test_full_filesystem_skipped_without_a_small_filesystem(tmp_path):
    r = CLAUSES["full_filesystem"](_real_env(tmp_path))
    assert r.verdict == SKIP and "--full-check" in r.detail


def test_full_filesystem_on_a_small_tmpfs(tmp_path, small_tmpfs):
    env = _real_env(tmp_path, full=Client(PosixFS(), small_tmpfs))
    r = CLAUSES["full_filesystem"](env)
    assert r.verdict == PASS, r.detail
    assert r.figures["errno"] == "ENOSPC" and r.figures["acknowledged_bytes"] > 0
    assert os.listdir(small_tmpfs) == ["q-full-after-2"]  # the filler was removed


def test_full_filesystem_control_swallowed_enospc_fails(tmp_path, small_tmpfs):
    env = _real_env(tmp_path, full=Client(SwallowENOSPC(PosixFS()), small_tmpfs),
                    full_limit=16 << 20)
    r = CLAUSES["full_filesystem"](env)
    assert r.verdict == FAIL
    assert "no error after writing" in r.detail and "read back wrong" in r.detail


def test_full_filesystem_control_never_full_fails():
    env, _ = sim_env()
    env.full, env.full_limit = env.a, 1 << 20
    r = CLAUSES["full_filesystem"](env)
    assert r.verdict == FAIL and "no error after writing 1,048,576 bytes" in r.detail


def _nfs_env(options: str) -> Env:
    sim = SimFS(0, clock=ManualClock(0.0))
    env, _ = sim_env(sim=sim, a=nfs_client(sim, "a", options), b=nfs_client(sim, "b", options))
    return env


def test_nfs_default_options_fail_the_entry_and_listing_clauses():
    """NFS defaults (acregmin=3, acdirmin=30, lookupcache=all): a name another client
    created stays "not found" and listings stay stale for 30 s -- longer than straw waits."""
    env = _nfs_env("defaults")
    verdicts = {n: CLAUSES[n](env) for n in SIM_CLAUSES}
    failed = sorted(n for n, r in verdicts.items() if r.verdict == FAIL)
    assert failed == ["entry_staleness", "listing_staleness"]
    assert verdicts["entry_staleness"].figures["new_name_open"]["unconverged"] == env.rounds
    attr = verdicts["attribute_staleness"].figures
    assert 3.0 <= attr["max"] < 3.5  # the attribute cache (acregmin) measured
    implied = implied_settings(list(verdicts.values()))
    assert implied["default_window_covers_it"] is False  # 3 s stale sizes: > 4.55 s / 2


def test_nfs_with_actimeo_0_and_lookupcache_positive_passes():
    env = _nfs_env("actimeo=0,lookupcache=positive")
    for n in SIM_CLAUSES:
        assert CLAUSES[n](env).verdict in (PASS, SKIP), n


def test_nfs_options_model():
    assert parse_options("defaults") == {"attr_timeout": 3.0, "dir_timeout": 30.0,
                                         "negative_timeout": 30.0}
    assert parse_options("noac")["negative_timeout"] == 0.0
    with pytest.raises(ValueError, match="not modelled"):
        parse_options("nolock")


def test_retry_window_matches_the_reader_schedule():
    assert retry_window(8, 0.05) == pytest.approx(4.55)
    assert retry_window(1, 0.05) == pytest.approx(0.05)


def test_prepare_rejects_bad_paths_and_writes_nothing(tmp_path):
    with pytest.raises(QualifyInputError, match="does not exist"):
        prepare(str(tmp_path / "missing"))
    (tmp_path / "file").write_text("x")
    with pytest.raises(QualifyInputError, match="not a directory"):
        prepare(str(tmp_path / "file"))
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    with pytest.raises(QualifyInputError, match="same volume"):
        prepare(str(a), peer=str(b), deadline=0.2)
    assert os.listdir(a) == [] and os.listdir(b) == [] and not (tmp_path / "missing").exists()


def test_run_on_a_temp_dir_passes_and_cleans_up(tmp_path):
    env = prepare(str(tmp_path), quick=True)
    rep = run(env)
    assert rep.passed, [r.to_dict() for r in rep.results if r.verdict == FAIL]
    assert rep.exit_status == 0
    assert {r.clause: r.verdict for r in rep.results}["full_filesystem"] == SKIP
    assert os.listdir(tmp_path / ".straw-qualify") == []
    assert rep.implied["visibility_retries"] >= 8 and rep.implied["profile"] == "local"


def _cli(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "straw.cli", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.juicefs
def test_qualify_passes_on_two_juicefs_mounts(juicefs_dirs, tmp_path):
    out = tmp_path / "q.json"
    p = _cli("qualify", juicefs_dirs.a, "--peer", juicefs_dirs.b, "--quick", "--json", str(out))
    assert p.returncode == 0, p.stdout + p.stderr
    rep = json.loads(out.read_text())
    assert rep["passed"] and rep["peer"] == juicefs_dirs.b
    v = rep["verdicts"]
    assert v["mount_options"] == "pass" and v["full_filesystem"] == "skip"
    assert all(x == "pass" for k, x in v.items() if k != "full_filesystem"), v
    attr = next(c for c in rep["clauses"] if c["clause"] == "attribute_staleness")
    assert attr["figures"]["max"] < 3.0  # JuiceFS's 1 s attribute cache, measured
    assert rep["implied"]["profile"] == "juicefs"
    assert rep["implied"]["declaration"]["writeback"] is False
    assert os.listdir(os.path.join(juicefs_dirs.a, ".straw-qualify")) == []


UNSAFE = ("--writeback", "--open-cache", "2")


@pytest.mark.juicefs
@pytest.mark.parametrize("juicefs_mounts", [{"extra_options": UNSAFE}], indirect=True)
def test_juicefs_unsafe_cache_options_flagged(juicefs_dirs):
    """Mounted with --writeback --open-cache 2: qualify fails the mount options (and sees
    the lost close-to-open visibility), and a store declared safe refuses to start."""
    env = prepare(juicefs_dirs.a, peer=juicefs_dirs.b, rounds=2, deadline=4.0)
    rep = run(env, ["mount_options", "close_to_open"])
    v = {r.clause: r for r in rep.results}
    assert v["mount_options"].verdict == FAIL
    assert "writeback=True" in v["mount_options"].detail
    assert "open cache 2.0 s" in v["mount_options"].detail
    assert v["close_to_open"].verdict == FAIL, v["close_to_open"].detail
    root = os.path.join(juicefs_dirs.a, "pool")
    decl = {"direct_mount": True, "writeback": False, "open_cache": 0, "readdir_cache": False,
            "client_version": "1.4", "durability_description": "test volume"}
    with pytest.raises(DeploymentMismatch) as exc:
        SharedFilesystemStore(root, "run", backend=FilesystemBackend(
            root, profile="juicefs", declaration=decl))
    assert "writeback: declared False, mount reports True" in str(exc.value)
    assert "open_cache: declared 0, mount reports 2.0" in str(exc.value)
    assert not os.path.exists(root)


def test_core_never_imports_cli_or_qualify():
    """Layering (DESIGN): straw's core modules never import straw.cli or straw.qualify,
    and straw never imports spec, model or fault_injection."""
    import ast
    core = os.path.join(ROOT, "straw")
    for name in sorted(os.listdir(core)):
        if not name.endswith(".py"):
            continue
        tree = ast.parse(open(os.path.join(core, name)).read())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                mods = [("." * node.level) + (node.module or a.name) for a in node.names]
            elif isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            else:
                continue
            for m in mods:
                assert not m.lstrip(".").startswith(("cli", "qualify", "straw.cli",
                                                     "straw.qualify")), (name, m)
                assert not m.startswith(("spec", "model", "fault_injection")), (name, m)
