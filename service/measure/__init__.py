"""Measurement on real hardware (IREE on this CPU) and calibration of the cost model."""
