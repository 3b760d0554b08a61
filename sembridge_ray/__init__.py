"""sembridge_ray: SemBridge vocabulary transfer for sparse retrievers, and the MaLSTM reproduction, on Ray.

Importing the package never imports Ray: Ray lives only in ``sembridge_ray.distributed`` and ``jobs``.
"""

__version__ = "0.1.0"
