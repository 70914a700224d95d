"""One trial's training: DeepSpeed set-up, the step loop, evaluation, checkpoints."""
