"""Export a transferred sparse model to the engines people search with, each export checked against
the exact answer (issue 36). Ray-free: plain functions and classes over sparse vectors
(:class:`.base.Vectors`); the Ray side (the corpus encoded through the cached encoding the evaluate
job uses) is :mod:`sembridge_ray.recipes.export.run`.

Targets (the registry :mod:`.targets`; each a :class:`.base.ExportTarget` declared in its module):
engines that search in this process (``qdrant``, ``milvus``, ``seismic``, ``pisa``), bulk files for
a search server (``opensearch``, ``opensearch-sparse-vector``, ``elasticsearch``), encoders
(``onnx``, ``onnx-optimized``, ``onnx-int8``, ``openvino``) and the inference-free variant
(``doc-only``). :mod:`.report` types ``export_report.json``. Every export ends with
:func:`sembridge_ray.export.parity.parity`: the target's top-10 against the project's exact sparse
search."""
