"""Conformance tests: the engine (``straw``, on SimFS) against the specification (``spec``)."""
