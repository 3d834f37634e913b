"""The rollout product: REST routes, protocol models, step rules (service) and the session store."""
