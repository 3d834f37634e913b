"""Training entry points: the reference flow-matching policy and the learned world model."""
