"""Downstream evaluation of a trained trial with EleutherAI's lm-evaluation-harness:
the model adapter, the mode it runs in and what it executed, task loading (offline), and
one trial's evaluation (docs/evaluation.md)."""
