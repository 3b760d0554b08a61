"""SPLADE-style sparse encoders: pooling, regularisers, losses, the training loop (no Ray
inside)."""
