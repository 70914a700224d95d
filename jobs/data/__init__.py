"""A trial's data: sources, tokenising, prepared shards, reading, batches to the device."""
