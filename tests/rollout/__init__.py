"""Tests of straw.rollout (the RL layer above the queue)."""
