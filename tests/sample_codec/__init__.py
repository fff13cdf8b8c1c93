"""Tests of straw.sample_codec (nested samples as msgpack plus tensor records)."""
