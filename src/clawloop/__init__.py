"""clawloop: serve, capture, judge and train a self-hosted agent model."""
__version__ = "0.1.0"
