"""Scale-out on Ray Serve: replicas of the one app, with rollout sessions any replica can serve.

``table`` (the committed-state table, plain Python) and ``store`` (the replica's side of it) need no
Ray; ``actor``, ``deployment`` and ``launch`` import Ray, installed by ``pip install "rollserve[ray]"``.
Design and failure model: docs/scale-out.md.
"""
