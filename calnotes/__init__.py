"""calnotes: measure and fix the calibration of neural networks."""
__version__ = "0.1.0"
