"""Pure scheduling decisions: no kopf, no Kubernetes client, no clock or randomness a test cannot inject.

Each module decides one thing and returns a value; the operator and the worker do the I/O.
`tests/project/test_layering.py` enforces the import rules.
"""
