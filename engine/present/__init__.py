"""Presentation: records as rows, tables, figures and reports. Reads records; never runs a model."""
