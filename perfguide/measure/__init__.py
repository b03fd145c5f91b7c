"""Measuring real runs: the meter, the verify() loop, calibration and the batch finder."""
