"""Adapters that serve other libraries' checkpoints through rollserve's ``Policy`` protocol.

Each adapter is one room of its own; the server and the engine never import one.
"""
