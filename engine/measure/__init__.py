"""Measurement: run configs become records (timers, memory, machine facts, quality), the SQLite store, sweeps."""
