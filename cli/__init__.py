"""The `scalelab` command: one typer app on top of the orchestrator (driving sweeps) and
analysis (answering about them) (docs/architecture.md, 'Layers')."""
