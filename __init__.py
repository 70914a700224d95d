"""scalelab: scaling experiments for efficient Transformers (docs/architecture.md)."""
