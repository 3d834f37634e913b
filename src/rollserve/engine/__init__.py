"""The engine layer: owns a model in one worker thread and batches requests across sessions."""

from rollserve.engine.batcher import BatchingWorker, Completed, EngineClosed, EngineStats, Superseded

__all__ = ["BatchingWorker", "Completed", "EngineClosed", "EngineStats", "Superseded"]
