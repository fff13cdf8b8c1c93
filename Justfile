# straw's tasks.  Run through the bootstrap: `python3 dev.py <recipe>` (it sets up .venv).
python := justfile_directory() + "/.venv/bin/python"

# The library's main job: a small RL run on a local Ray cluster over an embedded pool (temp dir)
demo *ARGS:
    {{python}} -m straw.cli.demo {{ARGS}}

# Qualify a filesystem before trusting it: just qualify /mnt/a --peer /mnt/b [--full-check DIR]
qualify *ARGS:
    {{python}} -m straw.cli qualify {{ARGS}}

# The whole test suite (lint, types, then pytest; JuiceFS tests install fuse3 when root).
test *ARGS: lint
    {{python}} tests/ensure_juicefs_deps.py
    {{python}} -m pytest -q --durations=25 {{ARGS}}

# ruff on all code, mypy on the engine and the spec
lint:
    {{python}} -m ruff check $(ls -d straw spec model fault_injection bench tests 2>/dev/null)
    {{python}} -m mypy $(ls -d straw spec 2>/dev/null)
# Benchmarks (never timed tests): the store against this machine's own limits, and
# against straw-queue 0.1.6 in its own virtualenv (.venv-peer, created on first use).
# Extra arguments pass through, e.g. `just bench --rounds 25 --json bench.json`.

# store vs raw write+fsync, append+fsync latency and memcpy, interleaved (~15-30 s); then
# retention figures and queue figures (one client, client processes, reopen at 100,000 tasks);
# then the catalog figures: a fresh open at 1,000,000 completed tasks, catalog bytes per task
# and a publisher's pause during compaction (building that history takes ~30 min here);
# then the rollout control overhead per group (1 and 8 generation processes, ~1 min) and
# the batch builder's memory and rank reads on 1,024 samples with 12.6 MB R3 routes each
# (writes 12.9 GB: ~5 min; it checks the free disk first); then a checkpoint's save at
# 100,000 accepted groups of history and 1,000 live, and an exact restore of 10,000 (~5 min)
bench *ARGS:
    {{python}} -m bench.bench {{ARGS}}
    {{python}} -m bench.retention
    {{python}} -m bench.queue_bench
    {{python}} -m bench.catalog_bench
    {{python}} -m bench.rollout_bench
    {{python}} -m bench.builder_bench
    {{python}} -m bench.archive_bench
    {{python}} -m bench.checkpoint_bench

# the distributed toy pipeline on a local 2-node Ray cluster, payloads in Ray's object store vs
# in straw, alternated in one run (3 rounds of 12 batches), then a kill of each job (~30 s):
# just bench-pipeline --batches 24
bench-pipeline *ARGS:
    {{python}} -m bench.pipeline_bench {{ARGS}}

# store, tensor and queue workloads against straw-queue 0.1.6, alternating the two (~2-3 min; --queue-history 0 skips the slow reopen pass)
bench-peer *ARGS:
    {{python}} -m bench.peer {{ARGS}}

# Model-check spec/ (the queue protocol and the rollout layer) at full bounds (safety + liveness)
# and require a counterexample for every mutant
model:
    {{python}} -m model.explore --config full --mutants --jobs 2

# Check the CrossHair contracts on the spec's pure helpers (5 s per condition, about a minute)
crosshair:
    {{python}} -m crosshair check spec/helpers.py --per_condition_timeout=5

# Crash campaigns (store, catalog, journal, coordinator), frame campaign, negative controls
# (~10-12 min on 2 idle cores, much longer on busy ones), then the checkpoint campaign (a
# rollout job's save and its exact and salvage restores: 1,220 crash points in 4 workloads,
# 4,880 states, and 4 controls, ~6 min); exit 1 on any violation
crash *ARGS:
    {{python}} -m fault_injection.campaigns {{ARGS}}
    {{python}} -m fault_injection.catalog_campaign
    {{python}} -m fault_injection.checkpoint_campaign

# Real processes under SIGKILL/SIGSTOP (store; queue with takeovers; two runs in one root; a rollout job; a checkpointed job resumed) on a temp dir and JuiceFS: just fuzz --seconds 60
fuzz *ARGS:
    {{python}} -m fault_injection.fuzz {{ARGS}}
