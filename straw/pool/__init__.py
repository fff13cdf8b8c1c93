"""The pool: packs, writers, publication, recovery, holds and the ownership catalog."""
