"""The files sembridge-ray bundles, as package data: ``data/`` (SICK 2014, STS 2012–2016, XQuAD,
KorQuAD 1.0, CMRC 2018, ARCD), ``tokenizers/`` (ar, zh, ko, hi), ``thesaurus/`` (from WordNet 3.0)
and ``bridge_cache/`` (the shipped bridge vectors, built by ``scripts/bridge_cache.py``). Each folder
holds its sources' licence notices; ``sembridge_ray.resources.asset`` resolves names here."""
