"""Answers about finished sweeps: results tables, scaling fits, plots and reports
(docs/architecture.md, 'Layers'). Reads what the orchestrator and the jobs recorded; the
orchestrator never imports it."""
