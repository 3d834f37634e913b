"""The policy product: websocket routes (session protocol, openpi), service, sessions, layouts."""
